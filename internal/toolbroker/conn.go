package toolbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/secret"
)

// Bounds of a stdio server's process and of an HTTP server's client.
const (
	// ServerPids and ServerMemory bound a stdio server's cgroup.
	ServerPids   = 64
	ServerMemory = 512 << 20
	// stderrTail is how much of a stdio server's stderr is kept, for the
	// host's log when it fails.
	stderrTail = 2 << 10
	// exitWait is how long Close waits for a stdio server to exit once its
	// stdin is closed, before killing it.
	exitWait = 2 * time.Second
	// frameSlack is what a frame may hold beyond a result's bound (the
	// JSON-RPC envelope), and the list's.
	frameSlack = 64 << 10
	// httpConns bounds the connections to one HTTP server.
	httpConns = 8
)

// errTooLarge is a frame or response of a server past its bound.
var errTooLarge = errors.New("the tool server's answer is past the broker's bound")

// conn is the connection to one server: made at first use, under its
// lock, once; a failure is kept as the answer of every later use.
type conn struct {
	srv   Server
	start startOpts // a stdio server's
	limit int64     // the most bytes of one frame or response
	logf  func(string, ...any)
	// tooLarge counts the answers cut at limit.
	tooLarge atomic.Uint64

	mu      sync.Mutex
	started bool
	err     error
	cs      *mcp.ClientSession
	proc    *process
	client  *http.Client // an HTTP server's
	dead    atomic.Bool  // the session ended
}

func newConn(s Server, start startOpts, l Limits, logf func(string, ...any)) *conn {
	return &conn{srv: s, start: start, limit: max(l.ResultBytes, MaxListBytes) + frameSlack, logf: logf}
}

// cgroupPath is the cgroup of run's server name under parent ("" none).
func cgroupPath(parent, run, name string) string {
	if parent == "" {
		return ""
	}
	clean := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return r
		}
		return '_'
	}, run)
	return parent + "/tool-" + clean + "-" + name
}

// fail makes c's every use fail with err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	c.started, c.err = true, err
	c.mu.Unlock()
}

// failed reports whether c failed to start or its session ended.
func (c *conn) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started && c.err != nil || c.dead.Load()
}

// session is c's MCP session, connecting (starting a stdio server) at
// the first use within ctx.
func (c *conn) session(ctx context.Context) (*mcp.ClientSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		c.started = true
		c.cs, c.err = c.connect(ctx)
		if c.err != nil {
			c.logf("toolbroker: tool server %s: %v", c.srv.Name, c.err)
		} else {
			cs := c.cs
			go func() { cs.Wait(); c.dead.Store(true) }()
		}
	}
	return c.cs, c.err
}

// connect starts the stdio server or reaches the HTTP one, and makes the
// MCP session (the initialize handshake) within ctx.
func (c *conn) connect(ctx context.Context) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "agentrun", Version: "1"}, nil)
	var t mcp.Transport
	if c.srv.URL != "" {
		c.client = c.httpClient()
		t = &mcp.StreamableClientTransport{Endpoint: c.srv.URL, HTTPClient: c.client, MaxRetries: -1,
			DisableStandaloneSSE: true, MaxEventSize: int(c.limit)}
	} else {
		p, err := startProcess(ctx, c.srv, c.start, c.limit, &c.tooLarge)
		if err != nil {
			return nil, fmt.Errorf("tool server %s failed to start: %w", c.srv.Name, err)
		}
		c.proc = p
		t = &mcp.IOTransport{Reader: p.stdout, Writer: p.stdin, MaxLineLength: -1} // p.stdout bounds each line
	}
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		if c.proc != nil {
			c.proc.stop()
			c.logf("toolbroker: tool server %s: stderr: %s", c.srv.Name, c.proc.stderrTail())
			c.proc = nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tool server %s failed to start: no answer to MCP's initialize in time", c.srv.Name)
		}
		return nil, fmt.Errorf("tool server %s failed to start: %w", c.srv.Name, cut(err))
	}
	return cs, nil
}

// close ends c's session and stops its process.
func (c *conn) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = true
	if c.err == nil {
		c.err = errors.New("the tool server is stopped")
	}
	var err error
	if c.cs != nil {
		done := make(chan struct{})
		go func() { c.cs.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(exitWait):
		}
		c.cs = nil
	}
	if c.proc != nil {
		err = c.proc.stop()
		c.proc = nil
	}
	if c.client != nil {
		c.client.CloseIdleConnections()
	}
	return err
}

// httpClient is the client of an HTTP server: bounded in time,
// connections and the bytes of each response, adding the config's
// headers to every request.
func (c *conn) httpClient() *http.Client {
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  0, // a call's own timeout bounds the wait for its answer
		IdleConnTimeout:        90 * time.Second,
		MaxConnsPerHost:        httpConns,
		MaxIdleConnsPerHost:    httpConns,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{Transport: &headerTransport{next: tr, headers: c.srv, limit: c.limit, tooLarge: &c.tooLarge},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// headerTransport adds a server's headers, each read from its file at
// each request, and bounds each response's body.
type headerTransport struct {
	next     http.RoundTripper
	headers  Server
	limit    int64
	tooLarge *atomic.Uint64
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for _, h := range t.headers.Headers {
		v, err := secret.Read(h.File)
		if err != nil {
			return nil, fmt.Errorf("header %s of tool server %s: %w", h.Header, t.headers.Name, err)
		}
		req.Header.Set(h.Header, h.Prefix+v)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitBody{rc: resp.Body, left: t.limit, tooLarge: t.tooLarge}
	return resp, nil
}

// limitBody fails a read past its bound with errTooLarge.
type limitBody struct {
	rc       io.ReadCloser
	left     int64
	tooLarge *atomic.Uint64
}

func (l *limitBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		l.tooLarge.Add(1)
		return 0, errTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.rc.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitBody) Close() error { return l.rc.Close() }
