package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/authlimit/authlimit/algo"
	"github.com/authlimit/authlimit/internal/rawsock"
)

// idleCheck is how long a decide connection may sit unused before it is
// checked, with a non-blocking peek at its socket, before its next call.
// A connection used again sooner is trusted: Redis answered on it less than
// this long ago. The check is what lets the first decisions after a Redis
// restart (or a CLIENT KILL, or Redis's idle timeout, which is whole
// seconds) redial instead of failing on a closed socket, and no restart
// brings a server back on its port within a millisecond: by the time one
// answers again, every connection it closed has been idle for longer, and
// is checked. Under load every connection is reused well within it (a few
// hundred µs apart at one client connection), so the busy path makes no
// system call but its write and its read; below about a thousand decisions
// a second per connection, the check's one system call is a small share of
// each decision's cost.
const idleCheck = time.Millisecond

// decideDialer makes the decide connections of a standalone or Sentinel client:
// plain connections to the Redis the client talks to, dialed by the
// client's own dialer (its TLS; with Sentinel, the master Sentinel names
// now) and logged in as the client would, that carry decide.lua with a
// write and a read and none of go-redis's per-call work: no pool, no
// health check per call, no hooks, no command objects.
type decideDialer struct {
	opts *goredis.Options
	// The commands' heads, up to the script's argument: EVALSHA <digest>
	// 0, and EVAL <source> 0 for a Redis that lost its script cache.
	evalSHA, eval []byte
}

// newDecideDialer returns the decide connections' maker for client, or nil if
// decisions must go through go-redis: a cluster, or a client whose
// connections do what cannot be reproduced here (an OnConnect hook,
// streaming credentials).
func newDecideDialer(client goredis.UniversalClient, sha, src string) *decideDialer {
	c, ok := client.(*goredis.Client)
	if !ok {
		return nil
	}
	o := c.Options()
	if o.Dialer == nil || o.OnConnect != nil || o.StreamingCredentialsProvider != nil {
		return nil
	}
	return &decideDialer{
		opts:    o,
		evalSHA: appendHead(nil, 4, "EVALSHA", sha, "0"),
		eval:    appendHead(nil, 4, "EVAL", src, "0"),
	}
}

// appendCommand appends a command: a RESP array of bulk strings.
func appendCommand(dst []byte, args ...string) []byte {
	return appendHead(dst, len(args), args...)
}

// appendHead appends the start of a command of n arguments: the array's
// length and the first arguments, args; the rest follow (see respConn.do).
func appendHead(dst []byte, n int, args ...string) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(n), 10)
	dst = append(dst, crlf...)
	for _, a := range args {
		dst = appendBulk(dst, a)
	}
	return dst
}

func appendBulk[T string | []byte](dst []byte, a T) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(len(a)), 10)
	dst = append(dst, crlf...)
	dst = append(dst, a...)
	return append(dst, crlf...)
}

// respConn is one decide connection, owned by one worker.
type respConn struct {
	nc   net.Conn
	sc   syscall.RawConn // its socket, for the idle check; nil if it has none
	in   []byte          // replies read; in[off:] not yet handed out
	off  int
	out  []byte
	used time.Time // when its last call began
}

// decideConn returns w's decide connection, dialing it if w has none or if
// the one it has was idle long enough to be checked and is closed.
// now is the call's start.
func (r *Store) decideConn(ctx context.Context, w *worker, now time.Time, deadline time.Time) (*respConn, error) {
	if !deadline.After(now) {
		// Nothing to send in: and a connection checked with a passed
		// deadline would look closed.
		return nil, fmt.Errorf("before sending: %w", context.DeadlineExceeded)
	}
	if c := w.conn; c != nil {
		if err := c.nc.SetDeadline(deadline); err == nil && (now.Sub(c.used) < idleCheck || c.alive()) {
			c.used = now
			return c, nil
		}
		w.dropConn()
	}
	select {
	case <-r.stop:
		return nil, fmt.Errorf("dial: %w", algo.ErrClosed)
	default:
	}
	c, err := r.direct.dial(ctx, deadline)
	if err != nil {
		return nil, err
	}
	c.used = now
	w.conn = c
	return c, nil
}

// openDecideConns dials the decide connection of every worker that is free
// and has none (or a closed one), so that the first burst of decisions
// dials nothing.
func (r *Store) openDecideConns(ctx context.Context) error {
	if r.direct == nil {
		return nil
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(r.direct.opts.DialTimeout)
	}
	held := make([]*worker, 0, r.conns)
	defer func() {
		for _, w := range held {
			r.free(w)
		}
	}()
	for range r.conns {
		w := r.slots.take()
		if w == nil {
			return nil // the others carry decisions, so they are open
		}
		held = append(held, w)
		w.deadline.at = deadline
		if _, err := r.decideConn(&w.deadline, w, time.Now(), deadline); err != nil {
			return fmt.Errorf("open connections: %w", err)
		}
	}
	return nil
}

// dropConn closes w's decide connection; the next call dials another.
func (w *worker) dropConn() {
	if w.conn != nil {
		_ = w.conn.nc.Close()
		w.conn = nil
	}
}

// dial opens a decide connection and logs it in: AUTH with the client's
// credentials, SELECT its database, CLIENT SETNAME its name, all in one
// round trip (a PING if there is nothing else to say, so that a TLS
// server's session tickets are read before the connection is first left
// idle, and the server has answered once). Everything, dial included,
// within the deadline. Its errors wrap ErrUnreachable, as no decision was
// sent, but for a handshake that outlasts the deadline (its TLS handshake
// too, with TLSDialer): that is a Redis that accepts connections and
// answers no command in the budget (stalled or paused), and it counts as a
// decision that timed out on the wire, as with go-redis, which logs in the
// same way.
func (wr *decideDialer) dial(ctx context.Context, deadline time.Time) (*respConn, error) {
	c, err := wr.open(ctx, deadline)
	if err == nil {
		return c, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, errDial) {
		return nil, err
	}
	return nil, fmt.Errorf("%w: %w", algo.ErrUnreachable, err)
}

// errDial marks a failed dial.
var errDial = errors.New("dial")

func (wr *decideDialer) open(ctx context.Context, deadline time.Time) (*respConn, error) {
	o := wr.opts
	user, pass := o.Username, o.Password
	switch {
	case o.CredentialsProviderContext != nil:
		var err error
		if user, pass, err = o.CredentialsProviderContext(ctx); err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
	case o.CredentialsProvider != nil:
		user, pass = o.CredentialsProvider()
	}
	nc, err := o.Dialer(ctx, o.Network, o.Addr)
	if err != nil {
		if isHandshake(err) {
			// Connected: a server that did not complete the TLS
			// handshake in the budget is one that answered no login.
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errDial, err)
	}
	c := &respConn{nc: rawsock.Wrap(nc), sc: socket(nc), in: make([]byte, 0, 512)}
	var names []string
	switch {
	case pass != "" && user != "":
		c.out, names = appendCommand(c.out, "AUTH", user, pass), append(names, "AUTH")
	case pass != "":
		c.out, names = appendCommand(c.out, "AUTH", pass), append(names, "AUTH")
	}
	if o.DB != 0 {
		c.out, names = appendCommand(c.out, "SELECT", strconv.Itoa(o.DB)), append(names, "SELECT")
	}
	if o.ClientName != "" {
		c.out, names = appendCommand(c.out, "CLIENT", "SETNAME", o.ClientName), append(names, "CLIENT SETNAME")
	}
	if len(names) == 0 {
		c.out, names = appendCommand(c.out, "PING"), append(names, "PING")
	}
	err = c.handshake(deadline, names)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

// handshake sends c.out and reads a reply per command named.
func (c *respConn) handshake(deadline time.Time, names []string) error {
	if err := c.nc.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := c.nc.Write(c.out); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	var failed error
	for _, name := range names {
		b, err := c.reply()
		if err != nil {
			return fmt.Errorf("handshake: %s: %w", name, err)
		}
		if b[0] == '-' && failed == nil {
			// The first refusal is the one to report: after a refused
			// AUTH the others are refused for want of it.
			failed = fmt.Errorf("handshake: %s: %s", name, b[1:len(b)-2])
		}
	}
	c.out = c.out[:0]
	return failed
}

// evalWire is evalRaw on w's own decide connection, and drops the
// connection after any error but a reply of Redis's that leaves it usable.
func (r *Store) evalWire(w *worker, deadline time.Time) error {
	c, err := r.decideConn(&w.deadline, w, time.Now(), deadline)
	if err != nil {
		return err
	}
	head := r.direct.evalSHA
	for try := 0; try < 2; try++ {
		if try == 1 {
			head = r.direct.eval
		}
		b, err := c.do(head, w.blob)
		if err != nil {
			// A network error, a timeout (whose reply may still come)
			// or a reply out of step: the connection cannot be trusted.
			w.dropConn()
			return err
		}
		switch b[0] {
		case '-':
			msg := string(b[1 : len(b)-2])
			if strings.HasPrefix(msg, "NOSCRIPT") {
				continue
			}
			if strings.HasPrefix(msg, "READONLY") {
				// A replica: after a failover, the old master. As
				// go-redis does, let the next dial find the master.
				w.dropConn()
			}
			return errors.New(msg)
		case ':':
			w.body = b // one admitted rule, as an integer: parseReply reads the line
			return nil
		}
		w.body, err = bulk(b)
		return err
	}
	return errors.New("NOSCRIPT after loading the script")
}

// do sends head, then arg as the command's last argument, in one write,
// and reads the reply, which stays valid until the next call.
func (c *respConn) do(head, arg []byte) ([]byte, error) {
	c.out = appendBulk(append(c.out[:0], head...), arg)
	if _, err := c.nc.Write(c.out); err != nil {
		return nil, err
	}
	b, err := c.reply()
	if err == nil && c.off != len(c.in) {
		err = fmt.Errorf("%d bytes after the reply", len(c.in)-c.off)
	}
	return b, err
}

// maxReply bounds a reply's size: decide.lua answers a few dozen bytes per
// request.
const maxReply = 64 << 20

// reply reads one whole reply: a simple string, an error, an integer or a
// bulk string.
func (c *respConn) reply() ([]byte, error) {
	if c.off == len(c.in) {
		c.in, c.off = c.in[:0], 0
	}
	var readErr error
	for {
		size, err := replySize(c.in[c.off:])
		if err != nil {
			return nil, err
		}
		if n := len(c.in) - c.off; size > 0 && n >= size {
			b := c.in[c.off : c.off+size]
			c.off += size
			return b, nil
		}
		if readErr != nil {
			return nil, readErr
		}
		if c.off > 0 {
			c.in = c.in[:copy(c.in, c.in[c.off:])]
			c.off = 0
		}
		if want := max(size, len(c.in)+512); want > cap(c.in) {
			c.in = append(c.in[:cap(c.in)], make([]byte, want-cap(c.in))...)[:len(c.in)]
		}
		n, err := c.nc.Read(c.in[len(c.in):cap(c.in)])
		c.in = c.in[:len(c.in)+n]
		readErr = err
		if n == 0 && err == nil {
			readErr = errors.New("read nothing")
		}
	}
}

// replySize is the size of the reply b starts with, or, if b does not hold
// its first line yet, 0.
func replySize(b []byte) (int, error) {
	end := bytes.Index(b, crlf)
	if end < 0 {
		if len(b) > 64<<10 {
			return 0, errors.New("reply line too long")
		}
		return 0, nil
	}
	if end == 0 {
		return 0, errors.New("empty reply line")
	}
	switch b[0] {
	case '+', '-', ':':
		return end + 2, nil
	case '$':
		n, _, err := respLine(b, '$')
		switch {
		case err != nil:
			return 0, err
		case n < 0:
			return end + 2, nil // nil
		case n > maxReply:
			return 0, fmt.Errorf("reply of %d bytes", n)
		}
		return end + 2 + int(n) + 2, nil
	}
	return 0, fmt.Errorf("unexpected reply %.40q", b)
}

// socket returns the socket nc is, or is over (a TLS connection's), or nil
// if it has none that can be reached. Over TLS a record may wait that TLS
// reads for itself, but a server sends those (session tickets) at once,
// before the handshake's replies, which dial reads: any byte waiting later
// is as unexpected as on a plain socket.
func socket(nc net.Conn) syscall.RawConn {
	for range 4 {
		if s, ok := nc.(syscall.Conn); ok {
			sc, err := s.SyscallConn()
			if err != nil {
				return nil
			}
			return sc
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		nc = u.NetConn()
	}
	return nil
}

// alive reports whether an idle connection is open with nothing waiting
// on it: Redis sends nothing unasked, so a byte waiting is the end of a
// connection it closed (an EOF), or a reply out of step. Its deadline must
// be in the future: a peek fails on a passed one.
func (c *respConn) alive() bool {
	if c.sc == nil {
		return true // as go-redis, which cannot look either
	}
	ok := false
	if err := c.sc.Read(func(fd uintptr) bool {
		ok = peekIdle(fd)
		return true
	}); err != nil {
		return false
	}
	return ok
}
