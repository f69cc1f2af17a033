package redistest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// LatencyProxy is a TCP proxy on 127.0.0.1 in front of one target that
// delays every byte it forwards, in both directions, by a delay the test
// can change at any time, and can stall or cut the link.
//
// Each chunk read from one side is stamped with the time it arrived plus
// the delay then in force, and written to the other side once that time
// has come. Chunks keep their order, and several can be in flight at once,
// so a link with delay d adds d to each direction without limiting the
// throughput to one chunk per d; a request and its reply take 2d more.
type LatencyProxy struct {
	// Addr is the proxy's host:port: point clients here.
	Addr string
	// Target is the host:port the proxy forwards to.
	Target string

	ln    net.Listener
	delay atomic.Int64
	wg    sync.WaitGroup

	mu sync.Mutex
	// paused is open while the proxy is paused; Resume closes it.
	paused chan struct{}
	conns  map[*proxyConn]struct{}
	closed bool
}

// proxyConn is one client connection and its connection to the target.
type proxyConn struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{}
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		close(pc.done)
		_ = pc.client.Close()
		_ = pc.server.Close()
	})
}

// NewLatencyProxy starts a proxy to target (host:port) with no delay, and
// closes it and every connection through it when t ends.
func NewLatencyProxy(t testing.TB, target string) *LatencyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: latency proxy to %s: listen: %v", target, err)
	}
	p := &LatencyProxy{Addr: ln.Addr().String(), Target: target, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// SetDelay sets the delay for chunks read from now on; chunks already
// waiting keep theirs.
func (p *LatencyProxy) SetDelay(d time.Duration) {
	p.delay.Store(int64(d))
}

// Delay returns the delay in force.
func (p *LatencyProxy) Delay() time.Duration {
	return time.Duration(p.delay.Load())
}

// Pause stops delivering, as a stalled link: the proxy still reads what
// both sides send (until its queues fill, when TCP's own flow control
// pushes back) and connects new clients, but writes nothing. A write that
// already began completes.
func (p *LatencyProxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
}

// Resume delivers again; chunks whose time came during the pause go out at
// once, in order.
func (p *LatencyProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

// Conns returns how many client connections are open through the proxy.
func (p *LatencyProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// CloseAll closes every open connection on both sides, as a dropped link;
// chunks still queued are lost. New connections are still accepted.
func (p *LatencyProxy) CloseAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.close()
	}
}

// Close stops listening, closes every connection and waits until the
// proxy's goroutines are gone. It is safe to call more than once.
func (p *LatencyProxy) Close() {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if !already {
		_ = p.ln.Close()
	}
	p.CloseAll()
	p.Resume()
	p.wg.Wait()
}

func (p *LatencyProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.DialTimeout("tcp", p.Target, adminTimeout)
		if err != nil {
			_ = client.Close()
			continue
		}
		pc := &proxyConn{client: client, server: server, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pc.close()
			return
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		var both sync.WaitGroup
		both.Add(2)
		p.wg.Add(3)
		go p.pipe(pc, client, server, &both)
		go p.pipe(pc, server, client, &both)
		go func() {
			defer p.wg.Done()
			both.Wait()
			pc.close()
			p.mu.Lock()
			delete(p.conns, pc)
			p.mu.Unlock()
		}()
	}
}

// chunk is bytes read from one side and the time they are due on the
// other.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe forwards src to dst: a reader goroutine stamps chunks and queues
// them, this goroutine writes each when due. When src ends, dst's write
// side is shut once the queue is delivered, so half-closes pass through.
func (p *LatencyProxy) pipe(pc *proxyConn, src, dst net.Conn, both *sync.WaitGroup) {
	defer p.wg.Done()
	defer both.Done()
	queue := make(chan chunk, 1024)
	var readErr error
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(queue)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				c := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.Delay())}
				select {
				case queue <- c:
				case <-pc.done:
					return
				}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()
	for c := range queue {
		if !p.waitDue(c.due, pc.done) {
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			pc.close()
			return
		}
	}
	// The queue is closed, so readErr is set.
	if !errors.Is(readErr, io.EOF) {
		pc.close()
		return
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// DialVia returns a dial function for go-redis (Options.Dialer,
// ClusterOptions.Dialer, FailoverOptions.Dialer) that connects through the
// proxy whose Target is the address asked for, and straight to the address
// when no proxy fronts it. Cluster nodes and sentinels hand out the real
// addresses of nodes and masters, so a client given only a proxy's address
// would otherwise soon bypass it.
func DialVia(proxies ...*LatencyProxy) func(ctx context.Context, network, addr string) (net.Conn, error) {
	via := make(map[string]string, len(proxies))
	for _, p := range proxies {
		via[p.Target] = p.Addr
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if a, ok := via[addr]; ok {
			addr = a
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// waitDue waits until due has passed and the proxy is not paused; false
// means the connection closed meanwhile.
func (p *LatencyProxy) waitDue(due time.Time, done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		paused := p.paused
		p.mu.Unlock()
		if paused != nil {
			select {
			case <-paused:
				continue
			case <-done:
				return false
			}
		}
		wait := time.Until(due)
		if wait <= 0 {
			return true
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
			// Look at the pause again before writing.
		case <-done:
			timer.Stop()
			return false
		}
	}
}
