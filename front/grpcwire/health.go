package grpcwire

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Health is the grpc.health.v1.Health service: a serving status per
// service name, "" being the server's overall status. Check answers a
// service's status, NOT_FOUND for a service it does not know; Watch sends
// the status at once (SERVICE_UNKNOWN for a service it does not know) and
// then each change, until the client cancels or the server stops.
type Health struct {
	mu       sync.Mutex
	statuses map[string]healthpb.HealthCheckResponse_ServingStatus
	watchers map[string]map[chan struct{}]struct{}
	shutdown bool
}

// NewHealth returns a health service that knows no service yet.
func NewHealth() *Health {
	return &Health{statuses: map[string]healthpb.HealthCheckResponse_ServingStatus{},
		watchers: map[string]map[chan struct{}]struct{}{}}
}

// Register serves h's Check and Watch on s.
func (h *Health) Register(s *Server) error {
	if err := Unary(s, "/grpc.health.v1.Health/Check", h.Check); err != nil {
		return err
	}
	return serverStream(s, "/grpc.health.v1.Health/Watch", func(ctx context.Context, r *healthpb.HealthCheckRequest, send func(proto.Message) error) error {
		return h.Watch(ctx, r, s.Draining(), send)
	})
}

// SetServingStatus sets service's status; after Shutdown it is ignored.
func (h *Health) SetServingStatus(service string, st healthpb.HealthCheckResponse_ServingStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.shutdown {
		h.setLocked(service, st)
	}
}

func (h *Health) setLocked(service string, st healthpb.HealthCheckResponse_ServingStatus) {
	h.statuses[service] = st
	for w := range h.watchers[service] {
		select {
		case w <- struct{}{}:
		default: // the watcher has a change to read already
		}
	}
}

// Shutdown sets every service NOT_SERVING, for good: later
// SetServingStatus calls are ignored.
func (h *Health) Shutdown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shutdown = true
	for service := range h.statuses {
		h.setLocked(service, healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// Check answers service's status.
func (h *Health) Check(_ context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.mu.Lock()
	st, ok := h.statuses[r.GetService()]
	h.mu.Unlock()
	if !ok {
		return nil, status.Error(codes.NotFound, "unknown service")
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// Watch sends service's status, then each change, until ctx ends or
// draining closes.
func (h *Health) Watch(ctx context.Context, r *healthpb.HealthCheckRequest, draining <-chan struct{}, send func(proto.Message) error) error {
	service := r.GetService()
	changed := make(chan struct{}, 1)
	h.mu.Lock()
	if h.watchers[service] == nil {
		h.watchers[service] = map[chan struct{}]struct{}{}
	}
	h.watchers[service][changed] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.watchers[service], changed)
		if len(h.watchers[service]) == 0 {
			delete(h.watchers, service)
		}
		h.mu.Unlock()
	}()
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	for stopping := false; ; {
		h.mu.Lock()
		st, ok := h.statuses[service]
		h.mu.Unlock()
		if !ok {
			st = healthpb.HealthCheckResponse_SERVICE_UNKNOWN
		}
		if st != last {
			if err := send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		if stopping {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-draining:
			// The last word: the status as the server stops.
			stopping = true
		}
	}
}
