package hostile

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Latencies are a well-behaved client's calls during an attack: how long
// each answered one took, and those that failed.
type Latencies struct {
	mu       sync.Mutex
	took     []time.Duration
	failures int
	first    error
}

func (l *Latencies) add(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failures++
		if l.first == nil {
			l.first = err
		}
		return
	}
	l.took = append(l.took, d)
}

// Calls is the number of calls answered, and Failures of those that
// failed; Err is the first failure.
func (l *Latencies) Calls() int    { l.mu.Lock(); defer l.mu.Unlock(); return len(l.took) }
func (l *Latencies) Failures() int { l.mu.Lock(); defer l.mu.Unlock(); return l.failures }
func (l *Latencies) Err() error    { l.mu.Lock(); defer l.mu.Unlock(); return l.first }

// P99 is the 99th percentile of the answered calls' latencies (0 if none).
func (l *Latencies) P99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.took) == 0 {
		return 0
	}
	s := slices.Clone(l.took)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

// String sums the calls up: "p99 1.2ms over 400 calls" and the failures.
func (l *Latencies) String() string {
	s := fmt.Sprintf("p99 %s over %d calls", l.P99().Round(10*time.Microsecond), l.Calls())
	if f := l.Failures(); f > 0 {
		s += fmt.Sprintf(", %d failed (first: %v)", f, l.Err())
	}
	return s
}

// LegitHTTP asks url every interval until ctx ends, over one kept-alive
// connection from source (an address on loopback, or "" for any), with
// headers (name, value pairs). An answer with a status in ok is a
// success; anything else, or no answer within timeout, a failure.
func LegitHTTP(ctx context.Context, url, source string, interval, timeout time.Duration, ok []int, headers ...string) *Latencies {
	l := &Latencies{}
	d := &net.Dialer{Timeout: timeout}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	// A call under way when ctx ends runs to its answer: the last one
	// is not cut short by the end of the measurement.
	callCtx := context.WithoutCancel(ctx)
	every(ctx, interval, func() {
		req, err := http.NewRequestWithContext(callCtx, http.MethodGet, url, nil)
		if err != nil {
			l.add(0, err)
			return
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			l.add(0, err)
			return
		}
		_ = resp.Body.Close()
		if !slices.Contains(ok, resp.StatusCode) {
			l.add(0, fmt.Errorf("status %d", resp.StatusCode))
			return
		}
		l.add(time.Since(start), nil)
	})
	return l
}

// LegitCheck makes a Check call every interval until ctx ends, with
// grpc-go's client over one connection from source (creds nil: plain
// text), for a request from client (the source address Check decides
// on). A call that returns OK (allowed or denied) is a success.
func LegitCheck(ctx context.Context, addr, source, client string, interval, timeout time.Duration, creds credentials.TransportCredentials) *Latencies {
	l := &Latencies{}
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	d := &net.Dialer{Timeout: timeout}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		l.add(0, err)
		return l
	}
	defer cc.Close()
	az := authv3.NewAuthorizationClient(cc)
	req := CheckRequest(client)
	callCtx := context.WithoutCancel(ctx)
	every(ctx, interval, func() {
		cctx, cancel := context.WithTimeout(callCtx, timeout)
		defer cancel()
		start := time.Now()
		_, err := az.Check(cctx, req)
		l.add(time.Since(start), err)
	})
	return l
}

// CheckRequest is a Check for a GET from client, as Envoy sends one.
func CheckRequest(client string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: client, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 50000}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/api/items", Host: "api.example.com",
			Headers: map[string]string{"user-agent": "hostile-legit", "accept": "*/*"}}},
	}}
}

// every runs fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for ctx.Err() == nil {
		fn()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}
