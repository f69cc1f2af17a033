package redistest

import (
	"fmt"
	"strconv"
	"strings"
)

// Slots is the number of hash slots in a Redis Cluster.
const Slots = 16384

// SlotRange is the hash slots First through Last, both included.
type SlotRange struct {
	First, Last int
}

// String formats r as CLUSTER NODES does: "5461-10922" or "42".
func (r SlotRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Contains reports whether slot is in r.
func (r SlotRange) Contains(slot int) bool {
	return slot >= r.First && slot <= r.Last
}

// slotCount returns how many slots the ranges hold.
func slotCount(ranges []SlotRange) int {
	n := 0
	for _, r := range ranges {
		n += r.Last - r.First + 1
	}
	return n
}

// KeySlot returns the hash slot of key as Redis Cluster computes it: CRC16
// (XMODEM) of the key, or of its hash tag (the part between the first "{"
// and the next "}", when not empty), modulo 16384.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for bit := 0; bit < 8; bit++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % Slots
}

// NodeView is one line of CLUSTER NODES: a node as one member of the
// cluster sees it at one moment.
type NodeView struct {
	// ID is the node's cluster id.
	ID string
	// Addr is the host:port clients use.
	Addr string
	// Myself marks the line of the node that answered.
	Myself bool
	// Master reports whether the node is a master (else a replica).
	Master bool
	// MasterID is a replica's master, "" for a master.
	MasterID string
	// Failed reports the "fail" or "fail?" flag.
	Failed bool
	// Handshake reports a node not yet fully met.
	Handshake bool
	// Connected reports whether the cluster bus link is up.
	Connected bool
	// Slots are the slots the node serves.
	Slots []SlotRange
	// Open are the node's open slots, as CLUSTER NODES prints them on the
	// answering node's own line: "[42->-<id>]" (migrating) or
	// "[42-<-<id>]" (importing).
	Open []string
}

// parseClusterNodes parses the reply of CLUSTER NODES.
func parseClusterNodes(reply string) ([]NodeView, error) {
	var views []NodeView
	for _, line := range strings.Split(strings.TrimSpace(reply), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("parse CLUSTER NODES line %q: too few fields", line)
		}
		v := NodeView{ID: f[0], Connected: f[7] == "connected"}
		v.Addr, _, _ = strings.Cut(f[1], "@")
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "myself":
				v.Myself = true
			case "master":
				v.Master = true
			case "fail", "fail?":
				v.Failed = true
			case "handshake":
				v.Handshake = true
			}
		}
		if f[3] != "-" {
			v.MasterID = f[3]
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				v.Open = append(v.Open, s)
				continue
			}
			lo, hi, isRange := strings.Cut(s, "-")
			first, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("parse CLUSTER NODES slot %q: %w", s, err)
			}
			last := first
			if isRange {
				if last, err = strconv.Atoi(hi); err != nil {
					return nil, fmt.Errorf("parse CLUSTER NODES slot %q: %w", s, err)
				}
			}
			v.Slots = append(v.Slots, SlotRange{first, last})
		}
		views = append(views, v)
	}
	return views, nil
}

// ownerOf returns the id of the non-failed master serving slot in views,
// "" when none does.
func ownerOf(views []NodeView, slot int) string {
	for _, v := range views {
		if !v.Master || v.Failed {
			continue
		}
		for _, r := range v.Slots {
			if r.Contains(slot) {
				return v.ID
			}
		}
	}
	return ""
}

// slotsOf returns the slots node id serves in views.
func slotsOf(views []NodeView, id string) []SlotRange {
	for _, v := range views {
		if v.ID == id {
			return v.Slots
		}
	}
	return nil
}
