package httpconn

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/authlimit/authlimit/internal/membudget"
)

// heldHead is a request's header block of about 30 KB that never ends.
func heldHead() string {
	var b strings.Builder
	b.WriteString("GET /auth HTTP/1.1\r\nHost: x\r\n")
	for b.Len() < 30_000 {
		b.WriteString("X-Padding: " + strings.Repeat("p", 100) + "\r\n")
	}
	return b.String()
}

// TestBudgetBoundsUnfinishedHeaders: connections holding unfinished
// header blocks hold the budget's bytes (the read buffer and what they
// sent), never more than it; beyond it the connections holding the most
// are closed, a whole request is still answered, and what they held is
// given back once they are gone.
func TestBudgetBoundsUnfinishedHeaders(t *testing.T) {
	const limit = 1 << 20
	b := membudget.New(limit)
	l := serveBudget(t, loopback(t), longTimeouts, ok, true, b)
	head := heldHead()
	const attackers = 40 // each holds 32 KiB + 30 KB: some 16 fit
	conns := make([]net.Conn, attackers)
	for i := range conns {
		conns[i] = dial(t, l)
		if _, err := io.WriteString(conns[i], head); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the budget full and the hoarders closed", func() bool {
		return b.Evictions() > 0 && b.Used() <= limit && l.open() < attackers
	})
	if b.Used() < limit/2 {
		t.Errorf("the held headers hold %d bytes of the budget; want them counted (> %d)", b.Used(), limit/2)
	}
	// A well-behaved request finds room: one of the hoarders goes.
	legit := dial(t, l)
	get(t, legit, bufio.NewReader(legit))
	// Those still open hold all they sent and the read buffer: no more
	// than the budget has room for stay, the well-behaved one aside.
	fit := limit / (32<<10 + len(head))
	waitFor(t, "no more hoarders open than the budget holds", func() bool {
		return l.open() <= fit+1
	})
	for _, c := range conns {
		_ = c.Close()
	}
	waitFor(t, "the budget given back", func() bool { return b.Used() == 0 })
}

// TestWholeGivesBack: a request read whole holds nothing in the budget
// once its handler says so (a request a shaping rule holds, say), and
// until then holds the read buffer and its bytes.
func TestWholeGivesBack(t *testing.T) {
	b := membudget.New(1 << 20)
	before, after := make(chan int64, 1), make(chan int64, 1)
	l := serveBudget(t, loopback(t), longTimeouts, func(ctx *fasthttp.RequestCtx) {
		before <- b.Used()
		Whole(ctx.Conn())
		after <- b.Used()
	}, true, b)
	c := dial(t, l)
	get(t, c, bufio.NewReader(c))
	if got := <-before; got < 32<<10 {
		t.Errorf("before Whole the request held %d bytes; want at least the read buffer's 32 KiB", got)
	}
	if got := <-after; got != 0 {
		t.Errorf("after Whole the request held %d bytes; want 0", got)
	}
}
