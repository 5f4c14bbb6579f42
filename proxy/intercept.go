package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/jsonkeys"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/secret"
	"github.com/agentrun/agentrun/internal/untrusted"
)

const (
	// maxHeld bounds the requests of one run held for approval at once;
	// more are refused at once.
	maxHeld = 8
	// heldEvery is the sustained rate at which a run may hold requests
	// for approval, past a burst of maxHeld: one more each heldEvery.
	// More are refused at once, so that a program that holds and abandons
	// requests in a loop cannot keep its approvers' channels busy.
	heldEvery = time.Second
	// bodyExcerpt is how much of a held request's body the approver sees.
	bodyExcerpt = approvals.BodyExcerptBytes
	// MaxURLBytes bounds the URL of a request to a service as it is shown
	// and recorded (scheme, host, path and query, escaped by
	// untrusted.Text): a longer one is refused with 403 before anyone is
	// asked, since it could not be shown whole.
	MaxURLBytes = 2 << 10
	// MaxFormBytes bounds the form body of a request to a service that
	// the proxy reads for a "_method" parameter before anything is sent:
	// a longer one is refused.
	MaxFormBytes = bufSize
	// MaxJSONBytes bounds the body of a held request that a server may
	// read as JSON: the proxy reads it whole before anyone is asked, to
	// refuse one with a key twice in an object; a longer one is refused.
	MaxJSONBytes = 64 << 10
	// maxMethodBytes bounds a request's method the same way.
	maxMethodBytes = 64
	// maxReasonPath bounds the path quoted in a refusal's reason.
	maxReasonPath = netpolicy.MaxReasonPath
	// idleTimeout closes an intercepted connection idle this long.
	idleTimeout = 30 * time.Second
)

// Reasons of service refusals (after "denied: ").
const (
	reasonOperator    = "denied by the operator"
	reasonTooManyApp  = "too many requests waiting for approval (at most 8 at once)"
	reasonTooOftenApp = "requests held for approval too often (at most 8, then 1 a second)"
	reasonAbandoned   = "request abandoned"
)

// prefixConn reads through r, which holds bytes already read from Conn.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// oneConnListener hands out one connection, then reports closed.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c == nil {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

var discardLog = log.New(io.Discard, "", 0)

// serveService answers the client connection c (bytes already read in br)
// as the service svc: TLS, which it terminates with a certificate from the
// run's CA, or plain HTTP. Each request goes through serviceRoundTrip.
func (p *Proxy) serveService(c net.Conn, br *bufio.Reader, svc *netpolicy.Service) {
	c.SetDeadline(time.Now().Add(headTimeout))
	var conn net.Conn = &prefixConn{Conn: c, r: br}
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	if looksLikeTLS(first[0]) {
		conn = tls.Server(conn, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return p.ca.leaf(svc.Host())
			},
		})
	}
	p.serveConn(c, conn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp := p.serviceRoundTrip(r.Context(), r, svc, c)
		defer resp.Body.Close()
		h := w.Header()
		for k, v := range resp.Header {
			h[k] = v
		}
		for _, k := range netpolicy.HopHeaders {
			h.Del(k)
		}
		w.WriteHeader(resp.StatusCode)
		if r.Method != http.MethodHead {
			io.Copy(w, resp.Body)
		}
	}))
}

// serveConn serves HTTP/1.1 with h on conn, which reads and writes the
// client connection c (through a TLS layer or the bytes already read),
// until the client closes it or the proxy is closed.
func (p *Proxy) serveConn(c, conn net.Conn, h http.Handler) {
	closed := make(chan struct{})
	var once sync.Once
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: headTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    bufSize,
		ErrorLog:          discardLog,
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				once.Do(func() { close(closed) })
			}
		},
	}
	srv.Serve(&oneConnListener{c: conn})
	select {
	case <-closed:
	case <-p.ctx.Done():
		c.Close()
		<-closed
	}
}

// serviceRoundTrip decides req to svc, which came on the client
// connection client, and, when it passes, sends it upstream with the
// injected headers. It always returns a response: the upstream's, or the
// proxy's own refusal. A request held for approval is withdrawn when the
// client hangs up: the approver's context ends, and it is never sent.
func (p *Proxy) serviceRoundTrip(ctx context.Context, req *http.Request, svc *netpolicy.Service, client net.Conn) *http.Response {
	rawPath, rawQuery, _ := strings.Cut(req.RequestURI, "?")
	rec := netpolicy.ServiceRequest{Service: svc.Name, Method: untrusted.Text(req.Method), Path: untrusted.Text(rawPath + queryPart(rawQuery))}
	deny := func(status int, reason string) *http.Response {
		rec.Reason = reason
		p.ledger.request(rec)
		p.ledger.deny(svc.Host(), svc.Port(), "service "+svc.Name+": "+reason)
		msg := fmt.Sprintf("agentrun: request to %s denied: %s", printable(svc.Authority()), reason)
		if reason == reasonOperator {
			msg = "agentrun: " + reasonOperator
		}
		return textResponse(req, status, msg, "X-Agentrun-Denied")
	}
	if !strings.HasPrefix(req.RequestURI, "/") {
		// Absolute form inside the tunnel: only for the service itself.
		u, err := url.Parse(req.RequestURI)
		if err != nil || u.User != nil || !p.sameService(u, svc) {
			return deny(http.StatusForbidden, "request names another host than the service")
		}
		rawPath, rawQuery = u.EscapedPath(), u.RawQuery
		rec.Path = untrusted.Text(rawPath + queryPart(rawQuery))
	}
	shownURL := untrusted.Text(svc.Origin() + rawPath + queryPart(rawQuery))
	if len(shownURL) > MaxURLBytes {
		rec.Path = untrusted.Cut(rec.Path, maxReasonPath)
		return deny(http.StatusForbidden, fmt.Sprintf("URL longer than %d bytes: too long to show", MaxURLBytes))
	}
	if len(rec.Method) > maxMethodBytes {
		rec.Method = untrusted.Cut(rec.Method, maxReasonPath)
		return deny(http.StatusForbidden, fmt.Sprintf("method longer than %d bytes", maxMethodBytes))
	}
	if req.Method == http.MethodConnect {
		return deny(http.StatusForbidden, "CONNECT inside a service connection")
	}
	if strings.Contains(req.RequestURI, "#") {
		// RFC 3986 readers end the path at "#": the rule would be matched
		// on more than the service reads.
		return deny(http.StatusForbidden, "request target has a # (a fragment is never sent)")
	}
	if h := overrideHeader(req.Header); h != "" {
		return deny(http.StatusForbidden, "header "+h+" would have the service act on another method or path than the one matched and shown")
	}
	rule, reason := svc.Match(req.Method, rawPath)
	if rule == nil {
		return deny(http.StatusForbidden, reason)
	}
	var body io.ReadCloser = req.Body
	overrides := netpolicy.MethodOverrides(rawQuery)
	if formBody(req.Header) {
		start, err := io.ReadAll(io.LimitReader(body, MaxFormBytes+1))
		if err != nil {
			return deny(http.StatusBadRequest, "request body unreadable")
		}
		if len(start) > MaxFormBytes {
			return deny(http.StatusForbidden, fmt.Sprintf("form body longer than %d bytes: its %s parameter cannot be checked", MaxFormBytes, netpolicy.MethodParam))
		}
		body = replay(start, body)
		overrides = append(overrides, netpolicy.MethodOverrides(string(start))...)
	}
	approve := rule.Approve
	shownMethod := rec.Method
	for _, m := range overrides {
		if len(m) > maxMethodBytes {
			return deny(http.StatusForbidden, fmt.Sprintf("%s longer than %d bytes", netpolicy.MethodParam, maxMethodBytes))
		}
		r, reason := svc.Match(m, rawPath)
		if r == nil {
			return deny(http.StatusForbidden, netpolicy.MethodParam+"="+untrusted.Text(m)+" would have the service act on another method: "+reason)
		}
		approve = approve || r.Approve
		shownMethod += " (" + netpolicy.MethodParam + "=" + untrusted.Text(m) + ")"
	}
	if approve {
		start, err := io.ReadAll(io.LimitReader(body, bodyExcerpt+1))
		if err != nil {
			return deny(http.StatusBadRequest, "request body unreadable")
		}
		if jsonBody(req.Header, start) {
			rest, err := io.ReadAll(io.LimitReader(body, MaxJSONBytes+1-int64(len(start))))
			if err != nil {
				return deny(http.StatusBadRequest, "request body unreadable")
			}
			start = append(start, rest...)
			if reason := jsonRefusal(req.Header, start); reason != "" {
				return deny(http.StatusForbidden, reason)
			}
		}
		body = replay(start, body)
		a := approvals.Request(svc.Name, shownMethod, shownURL, start)
		hctx, stop := untilHangup(ctx, client)
		d := p.approve(hctx, a)
		gone := errors.Is(context.Cause(hctx), errHungUp) || ctx.Err() != nil
		stop()
		rec.Approval = d.ID
		if d.By == reasonTooManyApp || d.By == reasonTooOftenApp {
			return deny(http.StatusForbidden, d.By)
		}
		if gone {
			// Nobody waits for the answer: not sent, even when approved.
			rec.Reason = reasonAbandoned
			p.ledger.request(rec)
			return textResponse(req, http.StatusForbidden, "agentrun: "+reasonAbandoned, "X-Agentrun-Denied")
		}
		if !d.Approved {
			return deny(http.StatusForbidden, reasonOperator)
		}
	}

	out, err := http.NewRequestWithContext(ctx, req.Method, svc.Origin(), body)
	if err != nil {
		return deny(http.StatusBadRequest, "request cannot be forwarded")
	}
	out.URL.Opaque, out.URL.RawQuery = rawPath, rawQuery
	out.Header = req.Header.Clone()
	removeHopHeaders(out.Header)
	out.ContentLength = req.ContentLength
	out.Host = svc.Authority()
	if (svc.TLS() && svc.Port() == 443) || (!svc.TLS() && svc.Port() == 80) {
		out.Host = svc.Host()
	}
	for _, in := range svc.Inject {
		v, err := secret.Read(in.File)
		if err != nil {
			rec.Reason = "credential " + in.Header + " unavailable"
			p.ledger.request(rec)
			p.ledger.fail(svc.Host(), svc.Port(), "service "+svc.Name+": "+err.Error())
			return textResponse(req, http.StatusBadGateway, "agentrun: service "+svc.Name+": credential "+in.Header+" unavailable", "X-Agentrun-Error")
		}
		out.Header.Set(in.Header, in.Prefix+v)
		rec.Injected = append(rec.Injected, http.CanonicalHeaderKey(in.Header))
	}
	resp, err := p.upstream.RoundTrip(out)
	if err != nil {
		var d *denial
		var e *egressError
		status, msg := http.StatusBadGateway, ""
		switch {
		case errors.As(err, &d):
			p.ledger.deny(d.host, d.port, d.reason)
			status, msg = http.StatusForbidden, "agentrun: egress to "+printable(svc.Authority())+" denied: "+d.reason
			rec.Reason = d.reason
		case errors.As(err, &e):
			p.ledger.fail(e.t.host, e.t.port, e.reason)
			msg = "agentrun: egress to " + printable(svc.Authority()) + " failed: " + e.reason
			rec.Reason = e.reason
		default:
			reason := upstreamReason(err)
			p.ledger.fail(svc.Host(), svc.Port(), reason)
			msg = "agentrun: egress to " + printable(svc.Authority()) + " failed: " + reason
			rec.Reason = reason
		}
		rec.Allowed = true
		p.ledger.request(rec)
		return textResponse(req, status, msg, "X-Agentrun-Error")
	}
	rec.Allowed, rec.Status = true, resp.StatusCode
	p.ledger.request(rec)
	return resp
}

// replay is body with start, already read from it, put back in front.
func replay(start []byte, body io.ReadCloser) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(start), body), body}
}

// formBody reports whether a server may read a request with header h as
// a form whose fields hold a "_method": its Content-Type is
// application/x-www-form-urlencoded, or it has none (Rack reads a POST
// without one as a form).
func formBody(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "" || mt == "application/x-www-form-urlencoded"
}

// jsonBody reports whether a server may read a held request's body, of
// which start is the beginning, as JSON: its Content-Type names JSON
// (application/json, a +json type, ndjson, ...), or its first byte past
// white space (and a byte order mark) opens an object or an array, as
// servers that decode a body whatever its type read it; or start is white
// space alone and the body goes on.
func jsonBody(h http.Header, start []byte) bool {
	if jsonType(h) {
		return true
	}
	rest := jsonStart(start)
	if len(rest) == 0 {
		return len(start) > bodyExcerpt
	}
	return rest[0] == '{' || rest[0] == '['
}

// jsonStart is body past white space and a byte order mark, which
// some readers skip before JSON.
func jsonStart(body []byte) []byte {
	const space = " \t\r\n"
	return bytes.TrimLeft(bytes.TrimPrefix(bytes.TrimLeft(body, space), []byte("\ufeff")), space)
}

// jsonType reports whether h's Content-Type names JSON.
func jsonType(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.Contains(strings.ToLower(mt), "json")
}

// jsonRefusal is why a held request whose body (whole in body, or cut
// past MaxJSONBytes) a server may read as JSON is refused before anyone
// is asked, or "": readers disagree on an object that holds a key twice
// (most take the last value, some the first), so the approver could read
// one value where the service reads another; and a body too long, too
// deep or, declared JSON, not JSON cannot be checked for one. An empty
// body passes, and so does one not declared JSON that is not JSON: it is
// shown as the program wrote it, as any other body.
func jsonRefusal(h http.Header, body []byte) string {
	if len(body) > MaxJSONBytes {
		return fmt.Sprintf("JSON body longer than %d bytes: it cannot be checked for a key that appears twice", MaxJSONBytes)
	}
	if len(jsonStart(body)) == 0 {
		return ""
	}
	err := jsonkeys.Check(jsonStart(body))
	var dup *jsonkeys.DuplicateError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &dup):
		return "JSON body: " + dup.Error() + ": a server may read another value than the one shown"
	case errors.Is(err, jsonkeys.ErrTooDeep):
		return "JSON body " + err.Error()
	case jsonType(h):
		return "body declared JSON is not JSON: it cannot be checked for a key that appears twice"
	}
	return ""
}

// upstreamReason names a failure of a service's upstream in a few words:
// the detail may carry the upstream's words, which stay out.
func upstreamReason(err error) string {
	var ce *tls.CertificateVerificationError
	var ue x509.UnknownAuthorityError
	var he x509.HostnameError
	switch {
	case errors.As(err, &ce), errors.As(err, &ue), errors.As(err, &he):
		return "upstream certificate not trusted"
	case errors.Is(err, context.Canceled):
		return reasonAbandoned
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return "upstream timed out"
	case errors.Is(err, errByteLimit):
		return "byte limit reached"
	}
	return "upstream failed"
}

// overrideHeaders are headers that common servers and frameworks read as
// the request's real method (Rack, Express's method-override, ASP.NET,
// Google's APIs, OData) or path (IIS URL Rewrite, Symfony, Zend): sent on,
// they would have a service act on other than what its rules matched and
// the approver was shown. Lower case, "-" for "_" (which CGI and WSGI
// servers read alike).
var overrideHeaders = []string{
	"x-http-method-override", "x-http-method", "x-method-override",
	"x-original-url", "x-rewrite-url",
}

// overrideHeader returns the name of the first header of h in
// overrideHeaders, escaped, or "".
func overrideHeader(h http.Header) string {
	for name := range h {
		k := strings.ReplaceAll(strings.ToLower(name), "_", "-")
		for _, o := range overrideHeaders {
			if k == o {
				return untrusted.Text(name)
			}
		}
	}
	return ""
}

func queryPart(q string) string {
	if q == "" {
		return ""
	}
	return "?" + q
}

// sameService reports whether the absolute URL u names svc.
func (p *Proxy) sameService(u *url.URL, svc *netpolicy.Service) bool {
	if u.Host == "" {
		return false
	}
	def := 80
	if strings.EqualFold(u.Scheme, "https") {
		def = 443
	}
	t, err := splitAuthority(u.Host, def)
	return err == nil && t.host == svc.Host() && t.port == svc.Port()
}

// textResponse is the proxy's own one-line plain-text answer to req.
func textResponse(req *http.Request, status int, msg, header string) *http.Response {
	body := msg + "\n"
	h := http.Header{"Content-Type": {"text/plain; charset=utf-8"}}
	if header != "" {
		h.Set(header, msg)
	}
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
		Request: req,
	}
}

// approve holds a request until the policy's approver decides, the
// approval times out, or ctx (the request, or the run) ends. It records
// the decision.
func (p *Proxy) approve(ctx context.Context, a approvals.Approval) netpolicy.ApprovalRecord {
	a.ID = approvals.NewID()
	rec := netpolicy.ApprovalRecord{ID: a.ID, Service: a.Service, Method: a.Method, URL: a.URL}
	p.mu.Lock()
	full := p.held >= maxHeld
	often := !full && !p.heldRate.Allow()
	if !full && !often {
		p.held++
	}
	p.mu.Unlock()
	switch {
	case full:
		rec.By = reasonTooManyApp
	case often:
		rec.By = reasonTooOftenApp
	case p.policy.Approve == nil:
		p.releaseHeld()
		rec.By = "no way to ask"
	default:
		// The hold ends with the request, or the run.
		rctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(p.ctx, cancel)
		d, end := approvals.Ask(rctx, p.policy.Approve, a, p.policy.ApprovalTimeout)
		stop()
		cancel()
		switch end {
		case approvals.TimedOut:
			rec.By = "timeout"
		case approvals.Withdrawn:
			rec.By = reasonAbandoned
		default:
			rec.Approved, rec.By, rec.Taken = d.Approved, printable(d.By), d.Taken
			if rec.By == "" {
				rec.By = "approver"
			}
		}
		p.releaseHeld()
	}
	// Past the bound, a program's flood of requests refused at once (or
	// decided by no one) leaves out only more of the same: every request
	// let through, and every decision a decider was told was taken, is
	// recorded (those need a person each).
	p.ledger.approval(rec, rec.Approved || rec.Taken)
	return rec
}

func (p *Proxy) releaseHeld() {
	p.mu.Lock()
	p.held--
	p.mu.Unlock()
}

// Held is how many requests wait for approval now.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// newUpstream is the transport of requests to services: it dials through
// connectService (allowlist and address checks, byte limits, the connection cap)
// and verifies the upstream against roots (nil: the host's).
func (p *Proxy) newUpstream() *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(port)
			if err != nil {
				return nil, err
			}
			return p.connectService(target{host, n})
		},
		TLSClientConfig:        &tls.Config{RootCAs: p.policy.UpstreamRoots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    connectTimeout,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        idleTimeout,
		DisableCompression:     true,
		MaxResponseHeaderBytes: bufSize,
	}
}
