// Package grpcwire serves gRPC over HTTP/2 in clear text (h2c with prior
// knowledge, as Envoy's gRPC client and grpc-go's insecure client speak
// it): unary methods registered by their full path, and the health
// service with its server-streaming Watch. It owns the wire: the accept
// loop, one reading goroutine per connection, HTTP/2 framing, flow
// control and the gRPC framing of messages, and runs each call's handler
// on a goroutine of its own (a worker that then waits for the next call),
// so that a call held for a while never holds the others. A method
// registered with UnaryRawAsync is started on the reader instead, and
// answered (Reply.Send) by whichever goroutine has its answer: a call that
// waits on something else (a store's batch) costs no goroutine and no
// hand-off of its own.
//
// A response is written by the goroutine that produced it, under the
// connection's lock: the frames of every response ready at that moment go
// out in one write, and the header blocks of a response are prebuilt.
//
// A handler's context is part of its call's stream and costs nothing
// until the handler asks for Done: it ends when the client resets the
// call, when the connection closes, when the call's grpc-timeout passes
// (its deadline), and when the call ends. It carries no values.
// WithoutCancel detaches it without an allocation.
//
// # Where things are
//
//   - server.go: Options, registration, the accept loop, the workers.
//   - conn.go: a connection's state (who owns which field, and the lock
//     rule), its reader's loop, its timeouts and its end.
//   - frames.go: each frame type, SETTINGS, resets, control frames.
//   - headers.go: a request's header block, and the streams it opens.
//   - flow.go: DATA and the flow-control windows both ways.
//   - calls.go: a call from its complete request to its queued answer.
//   - refusal.go: a request that is not a gRPC call, kept open until its
//     client's side ends, then answered.
//   - write.go: queueing frames and writing them, and the raw write path.
//   - wire.go: frame and HPACK encoding, grpc-timeout, grpc-message.
//
// # Why not grpc-go's server
//
// authlimit answers every Check and ShouldRateLimit of the proxies in
// front of it: the gRPC server's cost per call is paid on every request
// the proxies see. grpc-go's server is general (streams of every kind,
// interceptors, compressors, a writer goroutine per connection, a
// context, a metadata map and a transport stream per call); this one does
// only what Envoy's ext_authz and rate-limit clients ask, and costs about
// a third of grpc-go's per call.
//
// BenchmarkUnaryCall measures it: the same frame-level client (64
// connections, one call in flight each, over loopback) against a
// responder that writes a prebuilt answer and decodes nothing (floor),
// grpc-go's server and this package's, each with a Check handler that
// decides nothing. On 2 cores (November 2026), CPU per call of the whole
// process, the client's included: floor 21.8 µs, grpc-go 57.9 µs (111
// allocations), grpcwire 35.0 µs (41). Less the floor, a call costs
// grpc-go's server about 36 µs and this one about 13 µs. Re-measure with
//
//	go test -run '^$' -bench BenchmarkUnaryCall -benchtime 3s -count 3 ./front/grpcwire
//
// and compare cpu-ns/op less the floor's. In bench/RESULTS.md (make
// bench, whole systems), grpc-null, this server answering a canned Check,
// serves 0.7 to 1.05 times what fasthttp answering an empty 200 does, and
// authlimit's Check decides about as fast as its HTTP /auth.
package grpcwire
