package rls

import (
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/authlimit/authlimit/decide"
	"github.com/authlimit/authlimit/envoyconf"
	"github.com/authlimit/authlimit/internal/pbwire"
)

// request is what ShouldRateLimit reads of a RateLimitRequest, from the
// decoded message (fromMessage) or from its bytes (readRequest). Only the
// first MaxDescriptors descriptors, and of each only up to MaxEntries
// entries, are kept: a request with more is refused, and their counts say
// by how much.
type request struct {
	domain string
	hits   uint32 // hits_addend
	ndesc  int    // the descriptors, kept or not
	descs  []descriptor
	// entries are the kept descriptors' entries, each descriptor's in a
	// span.
	entries []envoyconf.Entry
}

// descriptor is a RateLimitDescriptor.
type descriptor struct {
	null     bool // a nil message in a decoded request's list
	from, to int  // its entries in request.entries, when kept
	nentries int  // its entries, kept or not
	// override is whether it has a limit: requests_per_unit and unit.
	override bool
	rpu      uint32
	unit     int32
	// addend is whether it has a hits_addend: hits.
	addend bool
	hits   uint64
}

// reset empties r, keeping its lists' capacity; the strings it held are
// dropped, so that a pooled request keeps no request's bytes alive.
func (r *request) reset() {
	descs, entries := r.descs[:0], r.entries
	clear(entries[:cap(entries)])
	*r = request{descs: descs, entries: entries[:0]}
}

// add adds a descriptor read by fill, unless MaxDescriptors are kept.
func (r *request) add(fill func(r *request, d *descriptor)) {
	r.ndesc++
	if r.ndesc > MaxDescriptors {
		return
	}
	d := descriptor{from: len(r.entries)}
	fill(r, &d)
	d.to = len(r.entries)
	r.descs = append(r.descs, d)
}

// entry adds an entry of d, unless it has more than MaxEntries.
func (r *request) entry(d *descriptor, key, value string) {
	d.nentries++
	if d.nentries <= MaxEntries {
		r.entries = append(r.entries, envoyconf.Entry{Key: key, Value: value})
	}
}

// fromMessage reads m into r.
func fromMessage(r *request, m *pb.RateLimitRequest) {
	r.reset()
	r.domain, r.hits = m.GetDomain(), m.GetHitsAddend()
	for _, md := range m.GetDescriptors() {
		r.add(func(r *request, d *descriptor) {
			d.null = md == nil
			for _, e := range md.GetEntries() {
				r.entry(d, e.GetKey(), e.GetValue())
			}
			if o := md.GetLimit(); o != nil {
				d.override, d.rpu, d.unit = true, o.GetRequestsPerUnit(), int32(o.GetUnit())
			}
			if h := md.GetHitsAddend(); h != nil {
				d.addend, d.hits = true, h.GetValue()
			}
		})
	}
}

// The field numbers of a RateLimitRequest and of the messages in it.
const (
	requestDomain       = 1 // RateLimitRequest.domain
	requestDescriptors  = 2 // RateLimitRequest.descriptors
	requestHitsAddend   = 3 // RateLimitRequest.hits_addend
	descriptorEntries   = 1 // RateLimitDescriptor.entries
	descriptorLimit     = 2 // RateLimitDescriptor.limit
	descriptorHits      = 3 // RateLimitDescriptor.hits_addend
	entryKey            = 1 // RateLimitDescriptor.Entry.key
	entryValue          = 2 // RateLimitDescriptor.Entry.value
	overrideRequests    = 1 // RateLimitOverride.requests_per_unit
	overrideUnit        = 2 // RateLimitOverride.unit
	uint64ValueValue    = 1 // google.protobuf.UInt64Value.value
	bytesType           = protowire.BytesType
	varintType          = protowire.VarintType
	responseOverallCode = 1 // RateLimitResponse.overall_code
	responseStatuses    = 2 // RateLimitResponse.statuses
	responseHeaders     = 3 // RateLimitResponse.response_headers_to_add
	responseMetadata    = 6 // RateLimitResponse.dynamic_metadata
	statusCode          = 1 // DescriptorStatus.code
	statusCurrentLimit  = 2 // DescriptorStatus.current_limit
	statusRemaining     = 3 // DescriptorStatus.limit_remaining
	statusReset         = 4 // DescriptorStatus.duration_until_reset
	limitRequests       = 1 // RateLimit.requests_per_unit
	limitUnit           = 2 // RateLimit.unit
	limitName           = 3 // RateLimit.name
	durationSeconds     = 1 // google.protobuf.Duration.seconds
	durationNanos       = 2 // google.protobuf.Duration.nanos
)

// readRequest reads the RateLimitRequest encoded in b into r as
// fromMessage reads the decoded message, without decoding it: r's strings
// point into b. It reports false, with r unspecified, when it cannot vouch
// that proto.Unmarshal decodes b without an error but for strings that
// are not UTF-8, which it reads as the bytes Envoy sent (see pbwire.Readable;
// sh is RateLimitRequest's shape): the caller then decodes it whole. A
// field of another wire type than its own is an unknown field, as
// proto.Unmarshal keeps it; a singular message that occurs twice is merged,
// its scalars the last seen.
func readRequest(r *request, b []byte, sh *pbwire.Shape) bool {
	if !pbwire.Readable(sh, b) {
		return false
	}
	r.reset()
	pbwire.Each(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) {
		switch {
		case num == requestDomain && typ == bytesType:
			r.domain = pbwire.Str(v)
		case num == requestDescriptors && typ == bytesType:
			r.add(func(r *request, d *descriptor) { readDescriptor(r, d, v) })
		case num == requestHitsAddend && typ == varintType:
			r.hits = uint32(x)
		}
	})
	return true
}

// readDescriptor reads a RateLimitDescriptor into d.
func readDescriptor(r *request, d *descriptor, b []byte) {
	pbwire.Each(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if typ != bytesType {
			return
		}
		switch num {
		case descriptorEntries:
			var key, value string
			pbwire.Each(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) {
				switch {
				case num == entryKey && typ == bytesType:
					key = pbwire.Str(v)
				case num == entryValue && typ == bytesType:
					value = pbwire.Str(v)
				}
			})
			r.entry(d, key, value)
		case descriptorLimit:
			d.override = true
			pbwire.Each(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) {
				switch {
				case num == overrideRequests && typ == varintType:
					d.rpu = uint32(x)
				case num == overrideUnit && typ == varintType:
					d.unit = int32(x)
				}
			})
		case descriptorHits:
			d.addend = true
			pbwire.Each(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) {
				if num == uint64ValueValue && typ == varintType {
					d.hits = x
				}
			})
		}
	})
}

// answer is a response as the service works it out, before it is made a
// message (message) or written to the wire (appendResponse).
type answer struct {
	overLimit bool
	statuses  []descStatus // one per descriptor, in order
	headers   []decide.Header
	metadata  *structpb.Struct // dynamic_metadata; nil for none
}

// descStatus is a DescriptorStatus.
type descStatus struct {
	overLimit bool
	limit     *envoyconf.Limit // current_limit; nil for none
	remaining uint32
	hasReset  bool // duration_until_reset is reset
	reset     time.Duration
}

// code is an OK or OVER_LIMIT code.
func code(overLimit bool) pb.RateLimitResponse_Code {
	if overLimit {
		return pb.RateLimitResponse_OVER_LIMIT
	}
	return pb.RateLimitResponse_OK
}

// appendResponse appends the encoding of a's RateLimitResponse, as
// proto.Marshal encodes message's.
func appendResponse(b []byte, a *answer) []byte {
	b = protowire.AppendTag(b, responseOverallCode, varintType)
	b = protowire.AppendVarint(b, uint64(code(a.overLimit)))
	for i := range a.statuses {
		st := &a.statuses[i]
		b = protowire.AppendTag(b, responseStatuses, bytesType)
		b = protowire.AppendVarint(b, uint64(statusLen(st)))
		b = protowire.AppendTag(b, statusCode, varintType)
		b = protowire.AppendVarint(b, uint64(code(st.overLimit)))
		if l := st.limit; l != nil {
			b = protowire.AppendTag(b, statusCurrentLimit, bytesType)
			b = protowire.AppendVarint(b, uint64(limitLen(l)))
			if l.RequestsPerUnit != 0 {
				b = protowire.AppendTag(b, limitRequests, varintType)
				b = protowire.AppendVarint(b, uint64(l.RequestsPerUnit))
			}
			if l.Unit != 0 {
				b = protowire.AppendTag(b, limitUnit, varintType)
				b = protowire.AppendVarint(b, uint64(int64(l.Unit)))
			}
			if l.Name != "" {
				b = protowire.AppendTag(b, limitName, bytesType)
				b = protowire.AppendString(b, l.Name)
			}
		}
		if st.remaining != 0 {
			b = protowire.AppendTag(b, statusRemaining, varintType)
			b = protowire.AppendVarint(b, uint64(st.remaining))
		}
		if st.hasReset {
			secs, nanos := durationParts(st.reset)
			b = protowire.AppendTag(b, statusReset, bytesType)
			b = protowire.AppendVarint(b, uint64(durationLen(secs, nanos)))
			if secs != 0 {
				b = protowire.AppendTag(b, durationSeconds, varintType)
				b = protowire.AppendVarint(b, uint64(secs))
			}
			if nanos != 0 {
				b = protowire.AppendTag(b, durationNanos, varintType)
				b = protowire.AppendVarint(b, uint64(int64(nanos)))
			}
		}
	}
	for _, h := range a.headers {
		b = protowire.AppendTag(b, responseHeaders, bytesType)
		b = protowire.AppendVarint(b, uint64(pbwire.HeaderValueLen(h.Name, h.Value)))
		b = pbwire.AppendHeaderValue(b, h.Name, h.Value)
	}
	if a.metadata != nil {
		// Its map's keys in order. Its strings are UTF-8 (see
		// metadataString), so it marshals; one that did not would be
		// left out rather than the answer.
		if mb, err := (proto.MarshalOptions{Deterministic: true}).Marshal(a.metadata); err == nil {
			b = protowire.AppendTag(b, responseMetadata, bytesType)
			b = protowire.AppendBytes(b, mb)
		}
	}
	return b
}

// statusLen is the length of st's DescriptorStatus.
func statusLen(st *descStatus) int {
	n := protowire.SizeTag(statusCode) + protowire.SizeVarint(uint64(code(st.overLimit)))
	if st.limit != nil {
		n += protowire.SizeTag(statusCurrentLimit) + protowire.SizeBytes(limitLen(st.limit))
	}
	if st.remaining != 0 {
		n += protowire.SizeTag(statusRemaining) + protowire.SizeVarint(uint64(st.remaining))
	}
	if st.hasReset {
		n += protowire.SizeTag(statusReset) + protowire.SizeBytes(durationLen(durationParts(st.reset)))
	}
	return n
}

// limitLen is the length of l's RateLimit.
func limitLen(l *envoyconf.Limit) int {
	n := 0
	if l.RequestsPerUnit != 0 {
		n += protowire.SizeTag(limitRequests) + protowire.SizeVarint(uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		n += protowire.SizeTag(limitUnit) + protowire.SizeVarint(uint64(int64(l.Unit)))
	}
	if l.Name != "" {
		n += protowire.SizeTag(limitName) + protowire.SizeBytes(len(l.Name))
	}
	return n
}

// durationParts is d as a google.protobuf.Duration, as durationpb.New
// makes it.
func durationParts(d time.Duration) (int64, int32) {
	return int64(d / time.Second), int32(d % time.Second)
}

// durationLen is the length of a Duration.
func durationLen(secs int64, nanos int32) int {
	n := 0
	if secs != 0 {
		n += protowire.SizeTag(durationSeconds) + protowire.SizeVarint(uint64(secs))
	}
	if nanos != 0 {
		n += protowire.SizeTag(durationNanos) + protowire.SizeVarint(uint64(int64(nanos)))
	}
	return n
}
