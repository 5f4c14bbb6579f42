package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// target is where a client asked to go.
type target struct {
	host string // canonical name: lower-case, no trailing dot
	port int
}

// denial is a refused request: why, and the host and port as the client
// wrote them (for the message and the report).
type denial struct {
	host   string
	port   int
	reason string
}

func (d *denial) Error() string { return d.reason }

// Denial reasons (the text after "denied: " in a 403 body).
const (
	reasonNotAllowed     = "not in allowlist"
	reasonIPLiteral      = "ip literals are not allowed"
	reasonUserinfo       = "userinfo in the authority is not allowed"
	reasonBadHost        = "invalid host name"
	reasonBadPort        = "invalid port"
	reasonNoHost         = "request names no host"
	reasonScheme         = "only http:// URLs may be proxied without CONNECT"
	reasonNoSNI          = "tls client hello without server name"
	reasonTooMany        = "too many connections"
	reasonTooManyClients = "too many connections to the gateway"
	reasonBytes          = "byte limit reached"
	reasonDNS            = "not in allowlist (dns)"
	reasonUnbound        = "no egress policy bound yet"
)

// checkHost turns a host as the client wrote it into a canonical name, or
// says why it is refused.
func checkHost(host string, port int) (target, error) {
	if netpolicy.IsIPLiteral(host) {
		return target{}, &denial{host, port, reasonIPLiteral}
	}
	h, ok := netpolicy.CanonicalName(host)
	if !ok {
		return target{}, &denial{host, port, reasonBadHost}
	}
	return target{h, port}, nil
}

// splitAuthority splits "host:port" (or "host" with defaultPort) as found
// in a CONNECT line or a Host header. Userinfo is refused.
func splitAuthority(auth string, defaultPort int) (target, error) {
	if i := strings.LastIndexByte(auth, '@'); i >= 0 {
		return target{}, &denial{auth[i+1:], defaultPort, reasonUserinfo}
	}
	host, portStr := auth, ""
	if strings.HasPrefix(auth, "[") || strings.Count(auth, ":") == 1 {
		h, p, err := net.SplitHostPort(auth)
		if err == nil {
			host, portStr = h, p
		} else if strings.HasPrefix(auth, "[") && strings.HasSuffix(auth, "]") {
			host = auth[1 : len(auth)-1]
		}
	}
	if netpolicy.IsIPLiteral(host) {
		return target{}, &denial{host, defaultPort, reasonIPLiteral}
	}
	port := defaultPort
	if portStr != "" || defaultPort == 0 {
		p, err := netpolicy.ParsePort(portStr)
		if err != nil {
			return target{}, &denial{host, 0, reasonBadPort}
		}
		port = p
	}
	if host == "" {
		return target{}, &denial{"", port, reasonNoHost}
	}
	return checkHost(host, port)
}

// proxyTarget returns the destination of a request sent to the explicit
// proxy: "CONNECT host:port" or an absolute-form "GET http://host/...".
func proxyTarget(req *http.Request) (target, error) {
	if req.Method == http.MethodConnect {
		// RequestURI is the authority exactly as sent.
		return splitAuthority(req.RequestURI, 0)
	}
	u := req.URL
	if u == nil || u.Host == "" && u.Scheme == "" {
		return target{}, &denial{"", 0, "request is not in absolute form (a proxy needs http://host/... or CONNECT)"}
	}
	if u.User != nil {
		return target{}, &denial{u.Hostname(), 0, reasonUserinfo}
	}
	if !strings.EqualFold(u.Scheme, "http") {
		return target{}, &denial{u.Hostname(), 0, reasonScheme}
	}
	if u.Host == "" {
		return target{}, &denial{"", 80, reasonNoHost}
	}
	return splitAuthority(u.Host, 80)
}

// hostTarget returns the destination of a plain HTTP request that arrived
// on a transparent listener for port: its Host header (or absolute URL).
// The port is always the listener's.
func hostTarget(req *http.Request, port int) (target, error) {
	if req.URL != nil && req.URL.User != nil {
		return target{}, &denial{req.URL.Hostname(), port, reasonUserinfo}
	}
	t, err := splitAuthority(req.Host, port)
	if err != nil {
		return t, err
	}
	t.port = port
	return t, nil
}

// readRequest reads one request head from br.
func readRequest(br *bufio.Reader) (*http.Request, error) {
	if err := peekHead(br); err != nil {
		return nil, err
	}
	return http.ReadRequest(br)
}

// maxHeadLines bounds the lines of a request head, so that parsing one
// allocates little beyond the buffer that holds it.
const maxHeadLines = 256

// peekHead waits, without consuming, until br holds a whole request head
// (up to the blank line), which must fit br's buffer in at most
// maxHeadLines lines. Until then only br's buffer holds it.
func peekHead(br *bufio.Reader) error {
	for {
		buf, _ := br.Peek(br.Buffered())
		end := bytes.Index(buf, []byte("\n\n"))
		if i := bytes.Index(buf, []byte("\n\r\n")); i >= 0 && (end < 0 || i < end) {
			end = i
		}
		if end >= 0 {
			if bytes.Count(buf[:end], []byte("\n")) >= maxHeadLines {
				return fmt.Errorf("request head of more than %d lines", maxHeadLines)
			}
			return nil
		}
		if br.Buffered() >= br.Size() {
			return errors.New("request head too large")
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return err
		}
	}
}

// TLS ClientHello parsing.

var errIncomplete = errors.New("incomplete tls client hello")

const (
	recordTypeHandshake    = 22
	handshakeClientHello   = 1
	extServerName          = 0
	maxClientHello         = 16 << 10
	maxRecordPayload       = 16<<10 + 2048
	serverNameTypeHostName = 0
)

// looksLikeTLS reports whether a connection starting with b is TLS.
func looksLikeTLS(b byte) bool { return b == recordTypeHandshake }

// clientHelloSNI returns the server name of the TLS ClientHello at the start
// of data ("" when it has none). errIncomplete means more bytes are needed.
func clientHelloSNI(data []byte) (string, error) {
	// Reassemble the handshake message from as many records as it spans.
	var hs []byte
	for {
		if len(data) < 5 {
			return "", errIncomplete
		}
		if data[0] != recordTypeHandshake || data[1] != 3 {
			return "", errors.New("not a tls handshake record")
		}
		n := int(data[3])<<8 | int(data[4])
		if n == 0 || n > maxRecordPayload {
			return "", errors.New("bad tls record length")
		}
		if len(data) < 5+n {
			return "", errIncomplete
		}
		hs = append(hs, data[5:5+n]...)
		data = data[5+n:]
		if len(hs) >= 4 {
			if hs[0] != handshakeClientHello {
				return "", errors.New("first handshake message is not a client hello")
			}
			msgLen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if msgLen > maxClientHello {
				return "", errors.New("tls client hello too large")
			}
			if len(hs) >= 4+msgLen {
				return parseClientHello(hs[4 : 4+msgLen])
			}
		}
		if len(hs) > maxClientHello+4 {
			return "", errors.New("tls client hello too large")
		}
	}
}

// reader is a bounds-checked cursor over a byte slice.
type reader struct {
	b  []byte
	ok bool
}

func (r *reader) take(n int) []byte {
	if !r.ok || n < 0 || n > len(r.b) {
		r.ok = false
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	v := r.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.take(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

// vec reads a vector with an n-byte length prefix.
func (r *reader) vec(n int) *reader {
	var l int
	switch n {
	case 1:
		l = r.u8()
	case 2:
		l = r.u16()
	}
	b := r.take(l)
	return &reader{b: b, ok: r.ok}
}

func parseClientHello(body []byte) (string, error) {
	r := &reader{b: body, ok: true}
	r.take(2)  // legacy_version
	r.take(32) // random
	r.vec(1)   // legacy_session_id
	r.vec(2)   // cipher_suites
	r.vec(1)   // legacy_compression_methods
	if !r.ok {
		return "", errors.New("malformed tls client hello")
	}
	if len(r.b) == 0 {
		return "", nil // no extensions at all
	}
	exts := r.vec(2)
	for exts.ok && len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.vec(2)
		if !exts.ok {
			break
		}
		if typ != extServerName {
			continue
		}
		list := data.vec(2)
		for list.ok && len(list.b) > 0 {
			nameType := list.u8()
			name := list.vec(2)
			if !list.ok || !name.ok {
				break
			}
			if nameType == serverNameTypeHostName {
				if len(name.b) == 0 {
					return "", errors.New("empty tls server name")
				}
				return string(name.b), nil
			}
		}
		return "", errors.New("malformed tls server_name extension")
	}
	if !exts.ok || !r.ok {
		return "", errors.New("malformed tls client hello extensions")
	}
	return "", nil
}
