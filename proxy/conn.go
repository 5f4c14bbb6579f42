package proxy

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

const bufSize = 32 << 10 // per client connection; bounds a request head or ClientHello

// headLimit lets at most n bytes through to the bufio.Reader that reads a
// request head, then is lifted for the body.
type headLimit struct {
	r io.Reader
	n atomic.Int64 // bytes left; < 0 means no limit
}

func (l *headLimit) Read(b []byte) (int, error) {
	n := l.n.Load()
	if n == 0 {
		return 0, errors.New("request head too large")
	}
	if n > 0 && int64(len(b)) > n {
		b = b[:n]
	}
	m, err := l.r.Read(b)
	if n > 0 {
		l.n.Add(-int64(m))
	}
	return m, err
}

func newClientReader(c net.Conn) (*bufio.Reader, *headLimit) {
	hl := &headLimit{r: c}
	hl.n.Store(bufSize)
	return bufio.NewReaderSize(hl, bufSize), hl
}

// handleProxy serves one connection to the explicit proxy (:3128).
func (p *Proxy) handleProxy(c net.Conn) {
	c.SetDeadline(time.Now().Add(headTimeout))
	br, hl := newClientReader(c)
	req, err := readRequest(br)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, "agentrun: malformed proxy request", "")
		return
	}
	if !p.bound.Load() {
		// The head is read (so that the client sees the answer, not a
		// reset); nothing of an unbound proxy's is the run's: not recorded.
		writeStatus(c, http.StatusForbidden, "agentrun: denied: "+reasonUnbound, "")
		return
	}
	hl.n.Store(-1)
	t, err := proxyTarget(req)
	if err != nil {
		p.refuse(c, err, false)
		return
	}
	if p.isTools(t) {
		if req.Method == http.MethodConnect {
			if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
				return
			}
			p.serveToolsConn(c, br)
			return
		}
		p.serveToolsOne(c, req)
		return
	}
	if svc := p.serviceFor(t); svc != nil {
		c.SetDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
				return
			}
			p.serveService(c, br, svc)
			return
		}
		p.serveOne(c, req, svc)
		return
	}
	up, err := p.connect(t)
	if err != nil {
		p.refuse(c, err, false)
		return
	}
	defer p.untrack(up)
	c.SetDeadline(time.Time{})
	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		p.splice(c, br, up)
		return
	}
	p.forwardHTTP(c, req, up, t)
}

// handleTransparent serves one connection to a transparent listener:
// TLS is routed by its ClientHello's server name, anything else is read as
// HTTP and routed by its Host header.
func (p *Proxy) handleTransparent(c net.Conn, port int) {
	c.SetDeadline(time.Now().Add(headTimeout))
	br, hl := newClientReader(c)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	if looksLikeTLS(first[0]) {
		sni, err := peekSNI(br)
		if err != nil {
			p.ledger.deny("", port, "malformed tls client hello")
			writeTLSAlert(c)
			return
		}
		if sni == "" {
			p.refuse(c, &denial{"", port, reasonNoSNI}, true)
			return
		}
		t, err := checkHost(sni, port)
		if svc := p.serviceFor(t); err == nil && svc != nil {
			hl.n.Store(-1)
			p.serveService(c, br, svc)
			return
		}
		if err == nil {
			var up net.Conn
			if up, err = p.connect(t); err == nil {
				defer p.untrack(up)
				hl.n.Store(-1)
				c.SetDeadline(time.Time{})
				p.splice(c, br, up)
				return
			}
		}
		p.refuse(c, err, true)
		return
	}
	req, err := readRequest(br)
	if err != nil {
		writeStatus(c, http.StatusBadRequest, "agentrun: malformed http request", "")
		return
	}
	hl.n.Store(-1)
	t, err := hostTarget(req, port)
	if err != nil {
		p.refuse(c, err, false)
		return
	}
	if p.isTools(t) {
		p.serveToolsOne(c, req)
		return
	}
	if svc := p.serviceFor(t); svc != nil {
		c.SetDeadline(time.Time{})
		p.serveOne(c, req, svc)
		return
	}
	up, err := p.connect(t)
	if err != nil {
		p.refuse(c, err, false)
		return
	}
	defer p.untrack(up)
	c.SetDeadline(time.Time{})
	p.forwardHTTP(c, req, up, t)
}

// peekSNI reads, without consuming, a whole ClientHello from br.
func peekSNI(br *bufio.Reader) (string, error) {
	for {
		buf, _ := br.Peek(br.Buffered())
		sni, err := clientHelloSNI(buf)
		if !errors.Is(err, errIncomplete) {
			return sni, err
		}
		if br.Buffered() >= br.Size() {
			return "", errors.New("tls client hello too large")
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return "", err
		}
	}
}

// egressError is an allowed destination that could not be reached: reason
// says what failed in a few words, err has the detail.
type egressError struct {
	t      target
	reason string
	err    error
}

func (e *egressError) Error() string { return e.reason + ": " + e.err.Error() }

// resolveReason names what went wrong resolving an allowed name. The
// detail of a resolver error (the host's resolver address) stays out.
func resolveReason(err error) string {
	var de *net.DNSError
	switch {
	case errors.As(err, &de) && de.IsNotFound:
		return "name does not resolve"
	case errors.As(err, &de) && de.IsTimeout, errors.Is(err, context.DeadlineExceeded):
		return "name resolution timed out"
	}
	return "name resolution failed"
}

// dialReason names what went wrong connecting to an allowed destination's
// addresses (errs joins the error of each address tried).
func dialReason(errs error) string {
	var ne net.Error
	switch {
	case errors.Is(errs, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(errs, syscall.EHOSTUNREACH):
		return "host unreachable"
	case errors.Is(errs, syscall.ENETUNREACH):
		return "network unreachable"
	case errors.Is(errs, syscall.ETIMEDOUT), errors.Is(errs, context.DeadlineExceeded),
		errors.As(errs, &ne) && ne.Timeout():
		return "connection timed out"
	}
	return "connection failed"
}

// connect dials t for the sandbox (see dialChecked): an address of the
// host's own passes only as an exact entry of the policy's HostPorts.
func (p *Proxy) connect(t target) (net.Conn, error) {
	return p.dialChecked(t, netpolicy.Dest{
		AllowRanges: p.policy.AllowRanges, DenyRanges: p.policy.DenyRanges,
		HostPorts: p.policy.HostPorts, Own: p.policy.Own,
	})
}

// connectService dials the upstream of a service, whose host and port
// the operator named (the program never chooses where it goes): the
// ranges and HostPorts apply, and the host's own addresses are not
// refused.
func (p *Proxy) connectService(t target) (net.Conn, error) {
	return p.dialChecked(t, netpolicy.Dest{
		AllowRanges: p.policy.AllowRanges, DenyRanges: p.policy.DenyRanges,
		HostPorts: p.policy.HostPorts, Own: func(netip.Addr) (bool, error) { return false, nil },
	})
}

// dialChecked resolves t, checks every candidate address and port with
// dest, when the dial happens, and dials the first one that passes, by
// IP: nothing is resolved again later. Refusals are recorded and returned
// as *denial, failures as *egressError.
func (p *Proxy) dialChecked(t target, dest netpolicy.Dest) (net.Conn, error) {
	if !p.allow.Match(t.host, t.port) {
		return nil, &denial{t.host, t.port, reasonNotAllowed}
	}
	if max := p.policy.MaxBytes; max > 0 && (p.bytesIn.Load() >= max || p.bytesOut.Load() >= max) {
		return nil, &denial{t.host, t.port, reasonBytes}
	}
	if !p.takeUpstream() {
		return nil, &denial{t.host, t.port, reasonTooMany}
	}
	release := true
	defer func() {
		if release {
			p.releaseUpstream()
		}
	}()
	ctx, cancel := context.WithTimeout(p.ctx, connectTimeout)
	defer cancel()

	var addrs []netip.Addr
	if a, ok := p.hosts[t.host]; ok {
		addrs = []netip.Addr{a}
	} else {
		var err error
		if addrs, err = p.resolve(ctx, t.host); err != nil {
			return nil, &egressError{t, resolveReason(err), fmt.Errorf("resolving %s: %w", t.host, err)}
		}
		if len(addrs) == 0 {
			return nil, &egressError{t, "name does not resolve", fmt.Errorf("resolving %s: no addresses", t.host)}
		}
	}
	var ok []netip.Addr
	var refusal error
	for _, a := range addrs {
		if err := dest.Check(netip.AddrPortFrom(a, uint16(t.port))); err != nil {
			if refusal == nil {
				refusal = err
			}
			continue
		}
		ok = append(ok, a.Unmap())
	}
	if len(ok) == 0 {
		return nil, &denial{t.host, t.port, refusal.Error()}
	}
	// IPv4 first (hosts often lack IPv6 routes), each try with its share
	// of the time so one black-holed address cannot use it all.
	slices.SortStableFunc(ok, func(a, b netip.Addr) int {
		return cmp.Compare(a.BitLen(), b.BitLen())
	})
	st := p.ledger.stats(t)
	var dialErr error
	for i, a := range ok {
		tryCtx, tryCancel := ctx, context.CancelFunc(func() {})
		if left := len(ok) - i; left > 1 {
			if dl, has := ctx.Deadline(); has {
				tryCtx, tryCancel = context.WithTimeout(ctx, time.Until(dl)/time.Duration(left))
			}
		}
		c, err := p.dial(tryCtx, "tcp", netip.AddrPortFrom(a, uint16(t.port)).String())
		tryCancel()
		if err != nil {
			dialErr = errors.Join(dialErr, err)
			continue
		}
		// From here the connection's Close gives the slot back.
		release = false
		st.conns.Add(1)
		mc := &meteredConn{Conn: c, p: p, st: st, t: t}
		mc.key, mc.registered = registerEgress(c)
		if !p.track(mc) {
			return nil, &egressError{t, "proxy closed", errors.New("run ending")}
		}
		return mc, nil
	}
	return nil, &egressError{t, dialReason(dialErr), fmt.Errorf("connecting to %s: %w", t.host, dialErr)}
}

func (p *Proxy) takeUpstream() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.policy.MaxConns > 0 && p.upstreams >= p.policy.MaxConns {
		return false
	}
	p.upstreams++
	return true
}

func (p *Proxy) releaseUpstream() {
	p.mu.Lock()
	p.upstreams--
	p.mu.Unlock()
}

// refuse answers a refused or failed request: an HTTP 403 (denials) or
// 502/503 (failures), or a TLS alert when the client speaks TLS. Both are
// recorded in the report. A 502 carries its reason in the status line too,
// since clients of a refused CONNECT show only that.
func (p *Proxy) refuse(c net.Conn, err error, tls bool) {
	var d *denial
	var e *egressError
	var msg, header, phrase string
	status := http.StatusForbidden
	switch {
	case errors.As(err, &d):
		p.ledger.deny(d.host, d.port, d.reason)
		msg = fmt.Sprintf("agentrun: egress to %s denied: %s", printable(hostPortString(d.host, d.port)), d.reason)
		header = "X-Agentrun-Denied"
		if d.reason == reasonTooMany {
			status = http.StatusServiceUnavailable
		}
	case errors.As(err, &e):
		p.ledger.fail(e.t.host, e.t.port, e.reason)
		msg = fmt.Sprintf("agentrun: egress to %s failed: %s", printable(hostPortString(e.t.host, e.t.port)), e.reason)
		if !strings.HasPrefix(e.reason, "name") { // a resolver's detail names the host's resolver
			msg += " (" + printable(e.err.Error()) + ")"
		}
		header = "X-Agentrun-Error"
		status = http.StatusBadGateway
		phrase = "Bad Gateway: " + e.reason
	default:
		msg = "agentrun: " + printable(err.Error())
		header = "X-Agentrun-Error"
		status = http.StatusBadGateway
	}
	if tls {
		writeTLSAlert(c)
		return
	}
	writeStatusPhrase(c, status, phrase, msg, header)
}

func hostPortString(host string, port int) string {
	if port == 0 {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// writeStatus writes a complete one-line plain-text response.
func writeStatus(c net.Conn, status int, msg, header string) {
	writeStatusPhrase(c, status, "", msg, header)
}

// writeStatusPhrase is writeStatus with a reason phrase other than the
// status's usual text (when phrase is not empty).
func writeStatusPhrase(c net.Conn, status int, phrase, msg, header string) {
	if phrase == "" {
		phrase = http.StatusText(status)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, phrase)
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	if header != "" {
		fmt.Fprintf(&b, "%s: %s\r\n", header, msg)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\nConnection: close\r\n\r\n%s\n", len(msg)+1, msg)
	c.SetWriteDeadline(time.Now().Add(headTimeout))
	io.WriteString(c, b.String())
}

// writeTLSAlert sends a fatal access_denied alert: TLS clients report
// "access denied".
func writeTLSAlert(c net.Conn) {
	c.SetWriteDeadline(time.Now().Add(headTimeout))
	c.Write([]byte{21, 3, 3, 0, 2, 2, 49})
}

// removeHopHeaders deletes from h the hop-by-hop headers: those named in
// its Connection header and netpolicy.HopHeaders.
func removeHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range netpolicy.HopHeaders {
		h.Del(name)
	}
}

// forwardHTTP sends req to up in origin form and copies the response back.
// One request per client connection: both sides are told to close, so a
// second request can never ride on a connection checked for another host.
func (p *Proxy) forwardHTTP(c net.Conn, req *http.Request, up net.Conn, t target) {
	removeHopHeaders(req.Header)
	req.Host = t.host
	if t.port != 80 {
		req.Host = net.JoinHostPort(t.host, strconv.Itoa(t.port))
	}
	req.URL.Scheme, req.URL.Host, req.URL.User = "", "", nil
	req.RequestURI = ""
	req.Close = true
	if err := req.Write(up); err != nil {
		if errors.Is(err, errByteLimit) {
			return
		}
		p.ledger.fail(t.host, t.port, "upstream closed before the request was sent")
		writeStatus(c, http.StatusBadGateway, fmt.Sprintf("agentrun: egress to %s failed: %s", hostPortString(t.host, t.port), printable(err.Error())), "X-Agentrun-Error")
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(up), req)
	if err != nil {
		if !errors.Is(err, errByteLimit) {
			p.ledger.fail(t.host, t.port, "no valid http response from upstream")
		}
		writeStatus(c, http.StatusBadGateway, fmt.Sprintf("agentrun: egress to %s failed: %s", hostPortString(t.host, t.port), printable(err.Error())), "X-Agentrun-Error")
		return
	}
	defer resp.Body.Close()
	resp.Close = true
	resp.Write(c)
}

// serveOne answers one plain-HTTP request already read from c to svc, then
// closes, as forwardHTTP does.
func (p *Proxy) serveOne(c net.Conn, req *http.Request, svc *netpolicy.Service) {
	resp := p.serviceRoundTrip(p.ctx, req, svc, c)
	defer resp.Body.Close()
	for _, h := range netpolicy.HopHeaders {
		resp.Header.Del(h)
	}
	resp.Close = true
	resp.Write(c)
}

// splice copies both ways between the client (reading through cr, which
// may hold bytes already read) and up, until both directions end or one
// fails.
func (p *Proxy) splice(c net.Conn, cr io.Reader, up net.Conn) {
	done := make(chan struct{})
	started := p.goTracked(func() {
		defer close(done)
		_, err := io.Copy(up, cr)
		if err == nil {
			closeWrite(up)
		} else {
			up.Close()
			c.Close()
		}
	})
	if !started {
		return
	}
	_, err := io.Copy(c, up)
	if err == nil {
		closeWrite(c)
	} else {
		up.Close()
		c.Close()
	}
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

var errByteLimit = errors.New("agentrun: byte limit reached")

// meteredConn is an upstream connection whose bytes count against the
// run's limits and the report.
type meteredConn struct {
	net.Conn
	p          *Proxy
	st         *hostStats
	t          target
	key        egressKey // its two ends, while registered (IsEgress)
	registered bool
	closed     atomic.Bool
}

func (m *meteredConn) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	if n > 0 {
		got := m.p.charge(&m.p.bytesIn, n)
		m.st.in.Add(int64(got))
		if got < n {
			m.cut()
			return got, errByteLimit
		}
	}
	return n, err
}

func (m *meteredConn) Write(b []byte) (int, error) {
	got := m.p.charge(&m.p.bytesOut, len(b))
	n, err := m.Conn.Write(b[:got])
	m.st.out.Add(int64(n))
	if err == nil && got < len(b) {
		m.cut()
		return n, errByteLimit
	}
	return n, err
}

func (m *meteredConn) CloseWrite() error {
	if cw, ok := m.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return m.Conn.Close()
}

func (m *meteredConn) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	m.p.releaseUpstream()
	if m.registered {
		unregisterEgress(m.key)
	}
	return m.Conn.Close()
}

// cut records the limit and closes the connection.
func (m *meteredConn) cut() {
	m.p.ledger.deny(m.t.host, m.t.port, "byte limit exceeded")
	m.Close()
}

// charge takes up to n bytes from the budget counted by total and returns
// how many were granted.
func (p *Proxy) charge(total *atomic.Int64, n int) int {
	max := p.policy.MaxBytes
	if max <= 0 {
		total.Add(int64(n))
		return n
	}
	for {
		cur := total.Load()
		left := max - cur
		if left <= 0 {
			return 0
		}
		take := min(int64(n), left)
		if total.CompareAndSwap(cur, cur+take) {
			return int(take)
		}
	}
}
