package pbwire

import (
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestAppendHeaderValue: a HeaderValue appended, and its length, are what
// proto.Marshal makes of it, empty keys and values too.
func TestAppendHeaderValue(t *testing.T) {
	for _, key := range []string{"", "Retry-After", strings.Repeat("k", 200)} {
		for _, value := range []string{"", "1", strings.Repeat("v", 130)} {
			want, err := proto.Marshal(&core.HeaderValue{Key: key, Value: value})
			if err != nil {
				t.Fatal(err)
			}
			got := AppendHeaderValue([]byte("x"), []byte(key), []byte(value))
			if string(got) != "x"+string(want) {
				t.Errorf("AppendHeaderValue(%q, %q) = %x, want %x", key, value, got[1:], want)
			}
			if n := HeaderValueLen([]byte(key), []byte(value)); n != len(want) {
				t.Errorf("HeaderValueLen(%q, %q) = %d, want %d", key, value, n, len(want))
			}
		}
	}
}

// TestWellFormed: a HeaderValue is vouched for as proto.Unmarshal decodes
// it: a key not UTF-8, a cut field, a group and a number too large are
// not; an unknown field, or a known one of another wire type, is.
func TestWellFormed(t *testing.T) {
	sh := NewShape((&core.HeaderValue{}).ProtoReflect().Descriptor())
	ok, _ := proto.Marshal(&core.HeaderValue{Key: "k", Value: "v", RawValue: []byte{0xff}})
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"marshalled", ok, true},
		{"empty", nil, true},
		{"unknown field", protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1), true},
		{"key as a varint", protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1), true},
		{"key not UTF-8", protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff}), false},
		{"cut", ok[:len(ok)-1], false},
		{"group", protowire.AppendTag(protowire.AppendTag(nil, 9, protowire.StartGroupType), 9, protowire.EndGroupType), false},
		{"number too large", protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1), false},
	} {
		if got := WellFormed(sh, tc.b); got != tc.want {
			t.Errorf("%s: WellFormed(%x) = %v, want %v", tc.name, tc.b, got, tc.want)
		}
		// Readable takes strings of any bytes, and nothing else more.
		if got, want := Readable(sh, tc.b), tc.want || tc.name == "key not UTF-8"; got != want {
			t.Errorf("%s: Readable(%x) = %v, want %v", tc.name, tc.b, got, want)
		}
		var m core.HeaderValue
		if err := proto.Unmarshal(tc.b, &m); tc.want && err != nil {
			t.Errorf("%s: vouched for, but proto.Unmarshal: %v", tc.name, err)
		}
	}
}
