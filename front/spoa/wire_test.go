package spoa

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// TestVarint: the encodings of the specification's table (section 3.1),
// each boundary on both sides, decoded back; truncated and over-long
// varints are refused.
func TestVarint(t *testing.T) {
	tests := []struct {
		v    uint64
		want []byte
	}{
		{0, []byte{0}},
		{239, []byte{239}},
		{240, []byte{0xf0, 0x00}},
		{2287, []byte{0xff, 0x7f}},
		{2288, []byte{0xf0, 0x80, 0x00}},
		{264431, []byte{0xff, 0xff, 0x7f}},
		{264432, []byte{0xf0, 0x80, 0x80, 0x00}},
		{33818863, []byte{0xff, 0xff, 0xff, 0x7f}},
		{33818864, []byte{0xf0, 0x80, 0x80, 0x80, 0x00}},
	}
	for _, tt := range tests {
		got := appendVarint(nil, tt.v)
		if !bytes.Equal(got, tt.want) {
			t.Errorf("appendVarint(%d) = %x, want %x", tt.v, got, tt.want)
		}
		v, n := readVarint(append(got, 0xaa))
		if v != tt.v || n != len(tt.want) {
			t.Errorf("readVarint(%x) = %d, %d; want %d, %d", got, v, n, tt.v, len(tt.want))
		}
		if _, n := readVarint(got[:len(got)-1]); n != 0 {
			t.Errorf("readVarint(%x), truncated: length %d, want 0", got[:len(got)-1], n)
		}
	}
	for _, v := range []uint64{math.MaxUint64, math.MaxUint64 - 1, 1 << 63, math.MaxUint32} {
		b := appendVarint(nil, v)
		if got, n := readVarint(b); got != v || n != len(b) {
			t.Errorf("readVarint(appendVarint(%d)) = %d, %d", v, got, n)
		}
	}
	for _, b := range [][]byte{
		{},
		bytes.Repeat([]byte{0xff}, 12), // never ends
		append(bytes.Repeat([]byte{0xff}, 10), 1),                    // past 64 bits
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, // overflows
	} {
		if v, n := readVarint(b); n != 0 {
			t.Errorf("readVarint(%x) = %d, %d; want length 0", b, v, n)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		v := r.Uint64() >> r.UintN(64)
		b := appendVarint(nil, v)
		if got, n := readVarint(b); got != v || n != len(b) {
			t.Fatalf("readVarint(appendVarint(%d)) = %d, %d (%x)", v, got, n, b)
		}
	}
}

// TestReadValue: each type's encoding read back; truncated data and the
// reserved types are refused.
func TestReadValue(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want value
		n    int
	}{
		{"null", []byte{0}, value{typ: dataNull}, 1},
		{"false", []byte{1}, value{typ: dataBool}, 1},
		{"true", []byte{0x11}, value{typ: dataBool, n: 1}, 1},
		{"int32", []byte{2, 7}, value{typ: dataInt32, n: 7}, 2},
		{"uint64", []byte{5, 0xf0, 0x00}, value{typ: dataUint64, n: 240}, 3},
		{"ipv4", []byte{6, 192, 0, 2, 1}, value{typ: dataIPv4, b: []byte{192, 0, 2, 1}}, 5},
		{"ipv6", append([]byte{7}, bytes.Repeat([]byte{1}, 16)...), value{typ: dataIPv6, b: bytes.Repeat([]byte{1}, 16)}, 17},
		{"string", []byte{8, 2, 'h', 'i'}, value{typ: dataString, b: []byte("hi")}, 4},
		{"empty binary", []byte{9, 0}, value{typ: dataBinary, b: []byte{}}, 2},
	}
	for _, tt := range tests {
		got, n := readValue(append(bytes.Clone(tt.b), 0xee))
		if n != tt.n || got.typ != tt.want.typ || got.n != tt.want.n || !bytes.Equal(got.b, tt.want.b) {
			t.Errorf("%s: readValue(%x) = %+v, %d; want %+v, %d", tt.name, tt.b, got, n, tt.want, tt.n)
		}
		if tt.n > 1 {
			if _, n := readValue(tt.b[:tt.n-1]); n != 0 {
				t.Errorf("%s truncated: length %d, want 0", tt.name, n)
			}
		}
	}
	for typ := byte(10); typ < 16; typ++ {
		if _, n := readValue([]byte{typ, 0, 0, 0, 0}); n != 0 {
			t.Errorf("reserved type %d: length %d, want 0", typ, n)
		}
	}
	if _, n := readValue([]byte{8, 5, 'a'}); n != 0 {
		t.Errorf("a string longer than its frame: length %d, want 0", n)
	}
}

// TestReadHello: HAPROXY-HELLO's items, and the status of each refusal.
func TestReadHello(t *testing.T) {
	item := func(b []byte, name string, v ...byte) []byte {
		return append(appendString(b, name), v...)
	}
	str := func(s string) []byte { return appendString([]byte{dataString}, s) }
	versions := func(b []byte, s string) []byte { return item(b, "supported-versions", str(s)...) }
	frameSize := func(b []byte, n uint64) []byte {
		return item(b, "max-frame-size", appendVarint([]byte{dataUint32}, n)...)
	}
	caps := func(b []byte, s string) []byte { return item(b, "capabilities", str(s)...) }
	good := caps(frameSize(versions(nil, "2.0"), 16380), "pipelining,async")

	tests := []struct {
		name       string
		p          []byte
		status     int
		pipelining bool
		health     bool
		maxFrame   uint64
	}{
		{"haproxy 2.6", good, statusNormal, true, false, 16380},
		{"health check", item(bytes.Clone(good), "healthcheck", dataBool|dataTrue), statusNormal, true, true, 16380},
		{"engine id and unknown items", item(item(bytes.Clone(good), "engine-id", str("x")...), "x-new", 4, 9), statusNormal, true, false, 16380},
		{"haproxy 3.1, pipelining off", caps(frameSize(versions(nil, " 2.0 "), 1<<20), ""), statusNormal, false, false, 1 << 20},
		{"a later minor and an older major", caps(frameSize(versions(nil, "1.0, 2.7"), 300), " async , pipelining"), statusNormal, true, false, 300},
		{"no versions", caps(frameSize(nil, 16380), "pipelining"), statusNoVersion, false, false, 0},
		{"no frame size", caps(versions(nil, "2.0"), "pipelining"), statusNoFrameSize, false, false, 0},
		{"no capabilities", frameSize(versions(nil, "2.0"), 16380), statusNoCapabilities, false, false, 0},
		{"version 1 only", caps(frameSize(versions(nil, "1.0"), 16380), ""), statusBadVersion, false, false, 0},
		{"version 3 only", caps(frameSize(versions(nil, "3.0"), 16380), ""), statusBadVersion, false, false, 0},
		{"version garbage", caps(frameSize(versions(nil, "2.x"), 16380), ""), statusBadVersion, false, false, 0},
		{"frame size 255", caps(frameSize(versions(nil, "2.0"), 255), ""), statusBadFrameSize, false, false, 0},
		{"versions not a string", item(nil, "supported-versions", dataUint32, 2), statusInvalid, false, false, 0},
		{"frame size not an integer", item(versions(nil, "2.0"), "max-frame-size", str("16380")...), statusInvalid, false, false, 0},
		{"truncated", good[:len(good)-3], statusInvalid, false, false, 0},
		{"an empty name", append([]byte{0}, str("x")...), statusInvalid, false, false, 0},
	}
	for _, tt := range tests {
		h, status := readHello(tt.p)
		if status != tt.status {
			t.Errorf("%s: status %d, want %d", tt.name, status, tt.status)
			continue
		}
		if status == statusNormal && (h.pipelining != tt.pipelining || h.healthcheck != tt.health || h.maxFrame != tt.maxFrame) {
			t.Errorf("%s: %+v, want pipelining %v, health check %v, max frame %d", tt.name, h, tt.pipelining, tt.health, tt.maxFrame)
		}
	}
}

// TestReadHeader: a frame's metadata, and truncated ones refused.
func TestReadHeader(t *testing.T) {
	f, _ := startFrame(nil, frameNotify, 300, 7)
	f = append(f, 'x')
	h, ok := readHeader(f[4:])
	if !ok || h.typ != frameNotify || h.flags != flagFin || h.sid != 300 || h.fid != 7 || string(h.payload) != "x" {
		t.Errorf("readHeader = %+v, %v", h, ok)
	}
	for n := 0; n < len(f)-5; n++ {
		if _, ok := readHeader(f[4 : 4+n]); ok {
			t.Errorf("readHeader of %d bytes: ok", n)
		}
	}
}
