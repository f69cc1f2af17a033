package rls

import (
	"context"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// ServeJSON answers envoyproxy/ratelimit's POST /json: a RateLimitRequest
// in protobuf's JSON mapping, answered with the RateLimitResponse the same
// way, 200 when OK and 429 when over the limit. A body that is not a
// request, or a request the service refuses, gets 400; no decision 503.
func (s *Service) ServeJSON(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, fasthttp.MethodPost)
		ctx.Error("method not allowed: POST a RateLimitRequest as JSON\n", fasthttp.StatusMethodNotAllowed)
		return
	}
	var req pb.RateLimitRequest
	if err := (protojson.UnmarshalOptions{}).Unmarshal(ctx.PostBody(), &req); err != nil {
		s.metrics.invalid.Inc()
		ctx.Error("bad request: the body is not a RateLimitRequest in JSON: "+err.Error()+"\n", fasthttp.StatusBadRequest)
		return
	}
	resp, err := s.shouldRateLimit(context.Background(), &req, s.json)
	if err != nil {
		code := fasthttp.StatusInternalServerError
		switch status.Code(err) {
		case codes.InvalidArgument:
			code = fasthttp.StatusBadRequest
		case codes.Unavailable:
			code = fasthttp.StatusServiceUnavailable
			ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		}
		ctx.Error(status.Convert(err).Message()+"\n", code)
		return
	}
	body, err := protojson.Marshal(resp)
	if err != nil {
		ctx.Error("the response could not be written\n", fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetContentType("application/json")
	if resp.GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT {
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	}
	ctx.SetBody(body)
}
