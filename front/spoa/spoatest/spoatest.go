// Package spoatest speaks HAProxy's side of SPOP, for tests: it sends
// HAPROXY-HELLO and NOTIFY frames with the authlimit message as
// haproxy/spoe-authlimit.conf has HAProxy send it, and reads the agent's
// answers. It is written apart from front/spoa, from doc/SPOE.txt, so that
// a misreading of the specification shared by both ends shows.
package spoatest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Client is one connection to an agent.
type Client struct {
	nc  net.Conn
	br  *bufio.Reader
	sid uint64
}

// Dial connects to the agent at addr, host:port or unix:<path> as
// AUTHLIMIT_SPOA_LISTEN takes it, and does the handshake, announcing
// maxFrame.
func Dial(addr string, maxFrame int) (*Client, error) {
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
	}
	nc, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Client{nc: nc, br: bufio.NewReader(nc)}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	var p []byte
	p = kvString(p, "supported-versions", "2.0")
	p = appendString(p, "max-frame-size")
	p = appendVarint(append(p, 3), uint64(maxFrame))
	p = kvString(p, "capabilities", "pipelining,async")
	if err := c.write(1, 0, 0, p); err != nil {
		nc.Close()
		return nil, err
	}
	typ, _, _, _, err := c.read()
	if err != nil {
		nc.Close()
		return nil, err
	}
	if typ != 101 {
		nc.Close()
		return nil, fmt.Errorf("spoatest: a frame of type %d answers HAPROXY-HELLO", typ)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.nc.Close() }

// Request is a client's request as HAProxy sees it.
type Request struct {
	Src    netip.Addr // invalid: none
	Method string
	Target string // the request line's target
	HTTPS  bool
	// Headers are name, value pairs in order, Host included.
	Headers []string
}

// Message is the authlimit message HAProxy sends for r.
func (r Request) Message() []byte {
	b := appendString(nil, "authlimit")
	b = append(b, 6)
	b = appendString(b, "src")
	switch {
	case r.Src.Is4():
		a := r.Src.As4()
		b = append(append(b, 6), a[:]...)
	case r.Src.Is6():
		a := r.Src.As16()
		b = append(append(b, 7), a[:]...)
	default:
		b = append(b, 0)
	}
	b = kvString(b, "method", r.Method)
	b = kvString(b, "url", r.Target)
	b = appendString(b, "host")
	host, ok := "", false
	for i := 0; i+1 < len(r.Headers); i += 2 {
		if strings.EqualFold(r.Headers[i], "host") {
			host, ok = r.Headers[i+1], true
		}
	}
	if ok {
		b = appendString(append(b, 8), host)
	} else {
		b = append(b, 0)
	}
	b = appendString(b, "https")
	if r.HTTPS {
		b = append(b, 0x11)
	} else {
		b = append(b, 1)
	}
	var block []byte
	for i := 0; i+1 < len(r.Headers); i += 2 {
		block = appendString(appendString(block, strings.ToLower(r.Headers[i])), r.Headers[i+1])
	}
	block = append(block, 0, 0)
	b = appendString(b, "headers")
	return appendString(append(b, 9), string(block))
}

// Ask sends r in a NOTIFY frame and returns the variables the ACK sets:
// strings as they are, integers in decimal.
func (c *Client) Ask(r Request) (map[string]string, error) {
	c.sid++
	if err := c.write(3, c.sid, 1, r.Message()); err != nil {
		return nil, err
	}
	typ, sid, _, p, err := c.read()
	switch {
	case err != nil:
		return nil, err
	case typ != 103:
		return nil, fmt.Errorf("spoatest: a frame of type %d answers NOTIFY", typ)
	case sid != c.sid:
		return nil, fmt.Errorf("spoatest: the ACK of stream %d answers stream %d", sid, c.sid)
	}
	return readActions(p)
}

// Start sends the first n bytes of the NOTIFY frame Ask would send for r,
// and nothing more: the agent waits for the rest.
func (c *Client) Start(r Request, n int) error {
	c.sid++
	b := frame(3, c.sid, 1, r.Message())
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	_, err := c.nc.Write(b[:min(n, len(b))])
	return err
}

// write writes a frame with FIN.
func (c *Client) write(typ byte, sid, fid uint64, p []byte) error {
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	_, err := c.nc.Write(frame(typ, sid, fid, p))
	return err
}

// frame is a frame with FIN.
func frame(typ byte, sid, fid uint64, p []byte) []byte {
	b := []byte{0, 0, 0, 0, typ, 0, 0, 0, 1}
	b = appendVarint(appendVarint(b, sid), fid)
	b = append(b, p...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// read reads a frame.
func (c *Client) read() (typ byte, sid, fid uint64, payload []byte, err error) {
	var l [4]byte
	if _, err = io.ReadFull(c.br, l[:]); err != nil {
		return
	}
	f := make([]byte, binary.BigEndian.Uint32(l[:]))
	if _, err = io.ReadFull(c.br, f); err != nil {
		return
	}
	if len(f) < 7 {
		return 0, 0, 0, nil, errors.New("spoatest: a frame under 7 bytes")
	}
	typ, p := f[0], f[5:]
	var n int
	if sid, n = readVarint(p); n == 0 {
		return 0, 0, 0, nil, errors.New("spoatest: no stream id")
	}
	p = p[n:]
	if fid, n = readVarint(p); n == 0 {
		return 0, 0, 0, nil, errors.New("spoatest: no frame id")
	}
	return typ, sid, fid, p[n:], nil
}

// readActions reads set-var actions.
func readActions(p []byte) (map[string]string, error) {
	vars := map[string]string{}
	for len(p) > 0 {
		if len(p) < 4 || p[0] != 1 || p[1] != 3 {
			return nil, fmt.Errorf("spoatest: action %x is not a set-var", p)
		}
		name, n := readString(p[3:])
		if n == 0 {
			return nil, errors.New("spoatest: a set-var without a name")
		}
		p = p[3+n:]
		switch p[0] & 0x0f {
		case 8, 9:
			v, n := readString(p[1:])
			if n == 0 {
				return nil, errors.New("spoatest: a truncated string")
			}
			vars[name] = v
			p = p[1+n:]
		case 2, 3, 4, 5:
			v, n := readVarint(p[1:])
			if n == 0 {
				return nil, errors.New("spoatest: a truncated integer")
			}
			vars[name] = strconv.FormatUint(v, 10)
			p = p[1+n:]
		default:
			return nil, fmt.Errorf("spoatest: a value of type %d", p[0]&0x0f)
		}
	}
	return vars, nil
}

func kvString(b []byte, name, v string) []byte {
	return appendString(append(appendString(b, name), 8), v)
}

func appendString(b []byte, s string) []byte {
	return append(appendVarint(b, uint64(len(s))), s...)
}

func readString(b []byte) (string, int) {
	n, k := readVarint(b)
	if k == 0 || n > uint64(len(b)-k) {
		return "", 0
	}
	return string(b[k : k+int(n)]), k + int(n)
}

// appendVarint and readVarint are doc/SPOE.txt's varints (section 3.1).
func appendVarint(b []byte, v uint64) []byte {
	if v < 240 {
		return append(b, byte(v))
	}
	b = append(b, byte(v)|0xf0)
	v = (v - 240) >> 4
	for v >= 128 {
		b = append(b, byte(v)|0x80)
		v = (v - 128) >> 7
	}
	return append(b, byte(v))
}

func readVarint(b []byte) (uint64, int) {
	if len(b) == 0 {
		return 0, 0
	}
	v := uint64(b[0])
	if v < 240 {
		return v, 1
	}
	for i, shift := 1, uint(4); i < len(b) && i < 10; i, shift = i+1, shift+7 {
		v += uint64(b[i]) << shift
		if b[i] < 128 {
			return v, i + 1
		}
	}
	return 0, 0
}
