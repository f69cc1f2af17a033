// Package spoa is authlimit's front for HAProxy's Stream Processing
// Offload Engine (SPOE): an agent (SPOA) speaking the Stream Processing
// Offload Protocol, SPOP 2.0, as HAProxy's doc/SPOE.txt specifies it
// (HAProxy 2.6's; 3.1 rewrote HAProxy's side and dropped fragmentation and
// the async capability, and speaks the same protocol otherwise). No Go
// SPOP library resolves from authlimit's module proxy, so the protocol is
// written here from the specification: Server is the protocol, Agent the
// decisions.
//
// # The protocol
//
// A connection starts with HAProxy's HAPROXY-HELLO: the agent answers
// AGENT-HELLO with version 2.0, the lesser of the two max-frame-sizes, and
// the capabilities pipelining and async (it answers NOTIFY frames in any
// order, each on the connection it came on), or AGENT-DISCONNECT with the
// status of what is wrong (no version of SPOP 2 offered, a missing item, a
// max-frame-size under 256). A health check's hello (healthcheck true) is
// answered and the connection closed. Then every NOTIFY frame gets one
// ACK, with the same stream and frame identifiers, once decided; many are
// decided at once. HAPROXY-DISCONNECT is answered with AGENT-DISCONNECT
// and the connection closed.
//
// Every byte is read as adversarial, and every malformed input has one
// outcome: AGENT-DISCONNECT with its status, then the connection closes. A
// frame over the max-frame-size is status 3; a frame under 7 bytes,
// truncated metadata, a KV-list or message list that does not parse, or a
// frame only an agent sends, status 4; a fragment (a frame without FIN,
// or of type 0), status 10: the agent announces no fragmentation, and
// haproxy/spoe-authlimit.conf turns HAProxy 2.x's off (3.1 has none).
// Frames of unknown types are skipped, as the specification says; a
// NOTIFY with ABORT is dropped unanswered. An authlimit message HAProxy
// sent but the agent cannot read (missing, mistyped arguments) is decided
// as a request the front could not read (decide.Input.Invalid:
// urn:authlimit:invalid-message).
//
// # Bounds
//
// A connection reads one frame at a time: one of up to 4 KiB in place in
// its read buffer; a larger one (up to the max-frame-size settled, at most
// MaxFrameSize) into a buffer whose bytes it takes from Options.Budget,
// the memory budget the other ports share, waiting for them up to
// FrameTimeout. A connection that holds the most of it when another's
// request needs room is closed (see membudget). At most MaxInFlight frames of a connection, and
// MaxInFlightTotal of all, are being decided or wait for their ACK to be
// written, and a connection holds at most 256 KiB of ACKs unwritten: past
// any of these, it reads nothing more until answers leave. A connection
// from a peer outside Options.Trusted is closed before a byte is read.
// HAPROXY-HELLO must come within HelloTimeout, a frame's bytes within
// FrameTimeout of its first, and the next frame within IdleTimeout
// (AGENT-DISCONNECT status 2 otherwise); an ACK that HAProxy does not read
// within WriteTimeout ends the connection.
//
// # The message
//
// The agent decides on the message named authlimit (see
// haproxy/spoe-authlimit.conf), whose arguments are, by name:
//
//	src     the client address HAProxy sees (src); none: the peer's
//	method  the method (method)
//	url     the request target (url), whose path and query the rules read
//	host    the Host header (req.hdr(host)); none without one
//	https   whether the client came over TLS (ssl_fc)
//	headers every header line (req.hdrs_bin)
//
// The engine is given exactly what /auth reads from the request
// haproxy/authlimit.lua sends for the same client request (see headers),
// so that a rule means the same behind either: the client is src; the
// method, path and host are normalized by the engine as /auth's; a rule's
// tier header is believed, the peer being trusted.
//
// # The answer
//
// An ACK sets transaction variables (txn.<var-prefix>.<name>, the prefix
// set in haproxy/spoe-authlimit.conf): verdict, always (decide.Verdict's
// name: allow, deny, invalid, blocked, unavailable, failed-open,
// unmatched, allowlisted, failed); status (the HTTP status), reason (the
// problem's kind) and body (the application/problem+json body) when the
// request is not admitted; and the rate-limit headers the outcome has,
// each in its own variable: ratelimit_policy, x_ratelimit_limit,
// x_ratelimit_remaining, x_ratelimit_reset, ratelimit and retry_after. An
// ACK too large for the max-frame-size leaves out the body first, then
// the headers from the last; verdict, status and reason always fit. A
// request a shaping rule delays gets its ACK once the delay has passed:
// HAProxy's timeout processing must exceed the longest delay=.
package spoa
