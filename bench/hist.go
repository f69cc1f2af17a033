package main

// This file is the latency histogram: log-linear buckets, so that recording
// is an array increment (no allocation, no lock) and percentiles keep a
// relative error below 1/histSub.

import (
	"math/bits"
	"time"
)

const (
	histSubBits = 6
	histSub     = 1 << histSubBits // linear sub-buckets per power of two
	histBuckets = (64 - histSubBits + 1) * histSub
)

// histogram counts durations in nanoseconds. Values below histSub have a
// bucket each; above, every power of two is split into histSub equal
// buckets. One goroutine records into its own histogram; merge combines
// them afterwards.
type histogram struct {
	counts [histBuckets]uint64
	total  uint64
}

// bucketOf is the bucket index of v nanoseconds.
func bucketOf(v uint64) int {
	if v < histSub {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits - 1
	return (shift+1)*histSub + int(v>>shift) - histSub
}

// bucketRange is the smallest and largest value of bucket i.
func bucketRange(i int) (lo, hi uint64) {
	if i < histSub {
		return uint64(i), uint64(i)
	}
	shift := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return m << shift, (m+1)<<shift - 1
}

// record counts one duration; negative durations count as zero.
func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(uint64(max(d, 0)))]++
	h.total++
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
}

// quantile is the value below which a fraction q of the recorded durations
// fall: the middle of the bucket holding that rank. Zero if empty.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q * float64(h.total))
	rank = min(max(rank, 1), h.total)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			lo, hi := bucketRange(i)
			return time.Duration(lo + (hi-lo)/2)
		}
	}
	return 0
}
