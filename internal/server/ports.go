package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// A live sandbox's ports (spec §17, docs/sandboxes.md#ports):
//
//	ANY /v1/sandboxes/ID/ports/PORT/PATH
//	ANY http://PORT-ID.PREVIEW_DOMAIN/PATH   (server.preview_domain set)
//
// reach the process listening on TCP PORT on the sandbox's loopback,
// HTTP and WebSocket upgrades alike, streamed both ways. The connection
// is made inside the sandbox's network namespace (runapi.Sandbox's
// DialPort): never through its proxy, and from no listener of the host's
// that a sandbox could reach. A request needs the API token (when one is
// set) or the sandbox's preview token (the X-Agentrun-Preview-Token
// header or the preview_token query parameter); neither reaches the
// sandbox.

// PreviewTokenHeader carries a sandbox's preview token.
const PreviewTokenHeader = "X-Agentrun-Preview-Token"

// previewTokenParam is the query parameter that carries it.
const previewTokenParam = "preview_token"

// portIdle closes a connection to a port, and the client's, when no byte
// has gone either way for so long (a variable for the tests).
var portIdle = 5 * time.Minute

// portTarget is a request for a sandbox's port: the sandbox, the port,
// and the path (with its query) that the sandbox's server gets.
type portTarget struct {
	id      string
	port    int
	path    string // escaped, from "/"
	preview bool   // by Host, on the preview domain
}

// portRoute is the port r asks for, by its Host on the preview domain or
// by its path; ok false when r is no port's. A port's request whose
// port is no number is one with port 0.
func portRoute(r *http.Request, sc *config.Server) (t portTarget, ok bool) {
	if id, port, ok := previewHost(r.Host, sc.PreviewDomain); ok {
		return portTarget{id: id, port: port, path: r.URL.EscapedPath(), preview: true}, true
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/sandboxes/")
	if !ok {
		return portTarget{}, false
	}
	parts := strings.SplitN(rest, "/", 4) // ID, "ports", PORT, PATH
	if len(parts) < 3 || parts[1] != "ports" || parts[0] == "" {
		return portTarget{}, false
	}
	t = portTarget{id: parts[0], port: portNumber(parts[2]), path: "/"}
	if len(parts) == 4 {
		t.path += parts[3]
	}
	return t, true
}

// portNumber is s as a TCP port, 0 when it is not one.
func portNumber(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != s {
		return 0
	}
	return n
}

// previewHost is the sandbox id and port that a Host header names on the
// preview domain (PORT-ID.DOMAIN, any case, any port); ok false when the
// domain is not set or the Host is not such a name.
func previewHost(hostport, domain string) (id string, port int, ok bool) {
	if domain == "" {
		return "", 0, false
	}
	name := strings.ToLower(strings.TrimSuffix(hostName(hostport), "."))
	label, ok := strings.CutSuffix(name, "."+strings.ToLower(strings.TrimSuffix(domain, ".")))
	if !ok || strings.Contains(label, ".") {
		return "", 0, false
	}
	p, id, ok := strings.Cut(label, "-")
	if port = portNumber(p); !ok || port == 0 || id == "" {
		return "", 0, false
	}
	return id, port, true
}

// servePort answers a request for a sandbox's port: the caller's
// credentials first (the API token, else the sandbox's preview token,
// under the throttle of wrong tokens), then the sandbox's server's own
// answer.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, t portTarget) {
	token := s.cfg.Load().Server.Token
	var sb runapi.Sandbox
	if s.Sandboxes != nil {
		sb = s.Sandboxes.Get(callerOf(r), t.id)
	}
	byToken := false
	if token != "" && r.Header.Get("Authorization") != "" {
		ok, wait := s.bearer(r, token)
		if wait > 0 {
			s.tooManyGuesses(w, wait)
			return
		}
		byToken = ok
	}
	if !byToken {
		got := r.Header.Get(PreviewTokenHeader)
		if got == "" {
			got = r.URL.Query().Get(previewTokenParam)
		}
		want := "\x00" // no sandbox: the guess still counts, and fails
		if sb != nil {
			want = sb.Info().PreviewToken
		}
		ok, wait := s.checkToken(r, got, want)
		if wait > 0 {
			s.tooManyGuesses(w, wait)
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentrun"`)
			writeError(w, http.StatusUnauthorized, "", "a sandbox's port needs the bearer token or the sandbox's preview token ("+PreviewTokenHeader+" or ?"+previewTokenParam+"=)")
			return
		}
	}
	if s.Sandboxes == nil {
		writeRefusal(w, errNoSandboxes)
		return
	}
	if sb == nil {
		writeError(w, http.StatusNotFound, "", "no such sandbox (it may have ended)")
		return
	}
	if t.port == 0 {
		writeError(w, http.StatusBadRequest, "", "the port is not a TCP port (1 to 65535)")
		return
	}
	proxyPort(w, r, sb, t, byToken)
}

// proxyPort streams r to t's port in sb and its answer back (an upgrade
// too), neither ever held whole; a connection idle portIdle either way
// is closed.
func proxyPort(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox, t portTarget, byToken bool) {
	host := net.JoinHostPort("localhost", strconv.Itoa(t.port))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL.Scheme, out.URL.Host, out.Host = "http", host, host
			out.URL.RawPath = t.path
			out.URL.Path = unescapedPath(t.path)
			q := out.URL.Query()
			if q.Has(previewTokenParam) {
				q.Del(previewTokenParam)
				out.URL.RawQuery = q.Encode()
			}
			out.Header.Del(PreviewTokenHeader)
			if byToken {
				out.Header.Del("Authorization")
			}
			dropUICookie(out.Header)
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := sb.DialPort(ctx, t.port)
				if err != nil {
					return nil, err
				}
				return &idleConn{Conn: c, idle: portIdle}, nil
			},
			// One connection per request: none is kept idle, holding
			// the sandbox's bound.
			DisableKeepAlives:      true,
			DisableCompression:     true,
			MaxResponseHeaderBytes: 64 << 10,
		},
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			if !t.preview {
				// The sandbox's pages, on serve's own origin, get an
				// opaque one: no script of theirs reads the API or the
				// approvals page, and no cookie of theirs is set here.
				res.Header.Add("Content-Security-Policy", "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads")
				res.Header.Del("Set-Cookie")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case errkind.Of(err) == errkind.Upstream:
				writeError(w, http.StatusBadGateway, "", fmt.Sprintf("port %d of the sandbox: %v", t.port, err))
			case errkind.Of(err) == errkind.Unavailable:
				ref := refusal(err, errkind.Unavailable, "")
				ref.RetryAfter = time.Second
				writeRefusal(w, ref)
			case errkind.Of(err) != errkind.Unknown:
				writeRefusal(w, err)
			case errors.Is(err, context.Canceled):
				// The client went away.
			default:
				writeError(w, http.StatusBadGateway, "", fmt.Sprintf("port %d of the sandbox: %v", t.port, err))
			}
		},
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w)}
	}
	rp.ServeHTTP(&idleWriter{ResponseWriter: w, rc: http.NewResponseController(w)}, r)
}

// unescapedPath is the escaped path p unescaped (p itself if it cannot
// be: RawPath is what goes out).
func unescapedPath(p string) string {
	u, err := url.PathUnescape(p)
	if err != nil {
		return p
	}
	return u
}

// dropUICookie removes serve's own approvals-page cookie from h's Cookie
// headers: it never reaches a sandbox.
func dropUICookie(h http.Header) {
	cookies := (&http.Request{Header: h}).Cookies()
	h.Del("Cookie")
	var kept []string
	for _, c := range cookies {
		if c.Name != uiCookie {
			kept = append(kept, c.String())
		}
	}
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}

// idleConn is a connection whose deadline moves on with each byte either
// way: it fails once idle passes with none.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) touch() { _ = c.Conn.SetDeadline(time.Now().Add(c.idle)) }

func (c *idleConn) Read(b []byte) (int, error) {
	c.touch()
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	c.touch()
	return c.Conn.Write(b)
}

// idleWriter gives each write to the client portIdle, and a connection
// the client upgraded (hijacked by the proxy) its idle bound.
type idleWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (w *idleWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(portIdle))
	return w.ResponseWriter.Write(b)
}

func (w *idleWriter) Flush() { _ = w.rc.Flush() }

func (w *idleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err != nil {
		return nil, nil, err
	}
	return &idleConn{Conn: c, idle: portIdle}, brw, nil
}

func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// idleBody gives each read of the client's body portIdle.
type idleBody struct {
	io.ReadCloser
	rc *http.ResponseController
}

func (b *idleBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(portIdle))
	return b.ReadCloser.Read(p)
}
