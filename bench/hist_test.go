package main

// Tests of the latency histogram.

import (
	"testing"
	"time"
)

func TestBucketRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 123456, 1 << 40, 1<<63 + 12345} {
		lo, hi := bucketRange(bucketOf(v))
		if v < lo || v > hi {
			t.Errorf("bucketRange(bucketOf(%d)) = [%d, %d], does not hold it", v, lo, hi)
		}
		if v >= histSub && float64(hi-lo) > float64(lo)/histSub {
			t.Errorf("bucket of %d is [%d, %d], wider than 1/%d", v, lo, hi, histSub)
		}
	}
	if got := bucketOf(^uint64(0)); got >= histBuckets {
		t.Errorf("bucketOf(max) = %d, want < %d", got, histBuckets)
	}
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		name string
		q    float64
		want time.Duration
	}{
		{"p50", 0.5, 500 * time.Microsecond},
		{"p99", 0.99, 990 * time.Microsecond},
		{"p99.9", 0.999, 999 * time.Microsecond},
	}
	var a, b histogram
	for i := 1; i <= 1000; i++ {
		h := &a
		if i%2 == 0 {
			h = &b
		}
		h.record(time.Duration(i) * time.Microsecond)
	}
	a.merge(&b)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := a.quantile(tt.q)
			if diff := float64(got-tt.want) / float64(tt.want); diff < -0.02 || diff > 0.02 {
				t.Errorf("quantile(%v) = %v, want %v within 2%%", tt.q, got, tt.want)
			}
		})
	}
	var empty histogram
	if got := empty.quantile(0.5); got != 0 {
		t.Errorf("empty quantile = %v, want 0", got)
	}
}
