package httpconn

import "bytes"

// bareLF looks at b, read after the bytes kept in c.head, for the end of a
// request's header block, and reports whether it ends in bare line feeds.
// Once the block ended well, or what was read is no request line, it stops
// looking until the next answer. A block that has not ended is kept in a
// pooled buffer of Config.MaxHeader bytes, counted in the budget: ok is
// false when the budget has no room for it.
func (c *Conn) bareLF(b []byte) (refused, ok bool) {
	max := c.l.cfg.MaxHeader
	if len(c.head) > 0 {
		// Beyond MaxHeader bytes fasthttp refuses the block itself.
		c.head = append(c.head, b[:min(len(b), max-len(c.head))]...)
		b = c.head
	}
	switch headerEnd(b) {
	case headerBareLF:
		return true, true
	case headerOpen:
		if len(b) < max {
			if len(c.head) == 0 {
				if !c.charge(int64(max)) {
					return false, false
				}
				c.headBuf = c.l.heads.Get().(*[]byte)
				c.head = append((*c.headBuf)[:0], b...)
			}
			return false, true
		}
	}
	c.scanning = false
	c.dropHead()
	return false, true
}

// dropHead gives c.head's buffer back to the pool.
func (c *Conn) dropHead() {
	if c.headBuf != nil {
		*c.headBuf = c.head[:0]
		c.l.heads.Put(c.headBuf)
		c.headBuf = nil
	}
	c.head = nil
}

// headerKind is what headerEnd found.
type headerKind int

const (
	headerOpen   headerKind = iota // the header block has not ended yet
	headerCRLF                     // it ended as fasthttp reads it
	headerBareLF                   // it ended in bare line feeds
	headerOther                    // no request line: a body, or garbage fasthttp refuses itself
)

// headerEnd finds where the header block starting b ends, as RFC 9112
// reads it: lines end in LF, with or without CR; empty lines before the
// request line are skipped. fasthttp reads a block that ends in CRLF CRLF,
// or an empty one ending in CRLF; it would wait on any other.
func headerEnd(b []byte) headerKind {
	for {
		if rest, ok := bytes.CutPrefix(b, []byte("\r\n")); ok {
			b = rest
		} else if rest, ok := bytes.CutPrefix(b, []byte("\n")); ok {
			b = rest
		} else {
			break
		}
	}
	first := bytes.IndexByte(b, '\n')
	if first < 0 {
		return headerOpen
	}
	if !isRequestLine(bytes.TrimSuffix(b[:first], []byte("\r"))) {
		return headerOther
	}
	for end := first + 1; ; {
		i := bytes.IndexByte(b[end:], '\n')
		if i < 0 {
			return headerOpen
		}
		line := b[end : end+i]
		end += i + 1
		if len(line) > 1 || len(line) == 1 && line[0] != '\r' {
			continue
		}
		if bytes.HasSuffix(b[:end], []byte("\r\n\r\n")) || end == first+3 && len(line) == 1 {
			return headerCRLF
		}
		return headerBareLF
	}
}

// isRequestLine reports whether line ends in an HTTP version, as fasthttp
// wants a request line to ("GET / HTTP/1.1").
func isRequestLine(line []byte) bool {
	n := len(line)
	return n > 9 && string(line[n-9:n-3]) == " HTTP/" && line[n-2] == '.' &&
		'0' <= line[n-3] && line[n-3] <= '9' && '0' <= line[n-1] && line[n-1] <= '9'
}
