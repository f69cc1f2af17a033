package spoa

import "bytes"

// This file is the HELLO handshake's and the DISCONNECT's payloads
// (sections 3.2.4, 3.2.5, 3.2.8 and 3.2.9).

// version is the SPOP version the agent speaks, the one HAProxy 1.7 to 3.x
// announce.
const version = "2.0"

// capabilities are the agent's: it answers NOTIFY frames in any order
// (pipelining) and would take them from any connection of an engine
// (async), though it always answers on the one a frame came on. It does
// not take fragmented frames: haproxy/spoe-authlimit.conf turns HAProxy's
// fragmentation off, and a fragment ends the connection (status 10).
const capabilities = "pipelining,async"

// hello is what a HAPROXY-HELLO frame says.
type hello struct {
	maxFrame    uint64
	healthcheck bool
	pipelining  bool // HAProxy announced it
}

// readHello reads a HAPROXY-HELLO frame's KV-list. It returns the status
// of the DISCONNECT frame that refuses it, or statusNormal: every
// mandatory item present with a value of its type, a supported version
// of SPOP 2 among those announced, and a max-frame-size of at least 256.
// Unknown items are skipped, as the specification says.
func readHello(p []byte) (hello, int) {
	var h hello
	var versions, frameSize, caps bool
	for len(p) > 0 {
		item, n := readKV(p)
		if n == 0 {
			return h, statusInvalid
		}
		p = p[n:]
		switch string(item.name) {
		case "supported-versions":
			if item.v.typ != dataString {
				return h, statusInvalid
			}
			if !supports(item.v.b) {
				return h, statusBadVersion
			}
			versions = true
		case "max-frame-size":
			if !item.v.isInt() {
				return h, statusInvalid
			}
			h.maxFrame, frameSize = item.v.n, true
		case "capabilities":
			if item.v.typ != dataString {
				return h, statusInvalid
			}
			caps = true
			h.pipelining = hasCapability(item.v.b, "pipelining")
		case "healthcheck":
			if item.v.typ != dataBool {
				return h, statusInvalid
			}
			h.healthcheck = item.v.n == 1
		}
	}
	switch {
	case !versions:
		return h, statusNoVersion
	case !frameSize:
		return h, statusNoFrameSize
	case !caps:
		return h, statusNoCapabilities
	case h.maxFrame < minFrameSize:
		return h, statusBadFrameSize
	}
	return h, statusNormal
}

// supports reports whether a supported-versions list ("2.0, 1.5") names a
// version of SPOP 2: announcing a major version means supporting all its
// minor ones, 2.0 included.
func supports(list []byte) bool {
	for len(list) > 0 {
		item := list
		if i := bytes.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		major, minor, ok := bytes.Cut(bytes.TrimSpace(item), []byte{'.'})
		if ok && string(major) == "2" && len(minor) > 0 && allDigits(minor) {
			return true
		}
	}
	return false
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// hasCapability reports whether a comma-separated capabilities list names
// c, spaces ignored.
func hasCapability(list []byte, c string) bool {
	for _, item := range bytes.Split(list, []byte{','}) {
		if string(bytes.TrimSpace(item)) == c {
			return true
		}
	}
	return false
}

// appendAgentHello appends the AGENT-HELLO frame: the version, the
// max-frame-size both sides keep to, and the capabilities.
func appendAgentHello(b []byte, maxFrame int) []byte {
	b, at := startFrame(b, frameAgentHello, 0, 0)
	b = appendString(b, "version")
	b = append(b, dataString)
	b = appendString(b, version)
	b = appendString(b, "max-frame-size")
	b = append(b, dataUint32)
	b = appendVarint(b, uint64(maxFrame))
	b = appendString(b, "capabilities")
	b = append(b, dataString)
	b = appendString(b, capabilities)
	return endFrame(b, at)
}

// appendAgentDisconnect appends an AGENT-DISCONNECT frame with the status
// and its message.
func appendAgentDisconnect(b []byte, status int) []byte {
	b, at := startFrame(b, frameAgentDisconnect, 0, 0)
	b = appendString(b, "status-code")
	b = append(b, dataUint32)
	b = appendVarint(b, uint64(status))
	b = appendString(b, "message")
	b = append(b, dataString)
	b = appendString(b, statusMessages[status])
	return endFrame(b, at)
}
