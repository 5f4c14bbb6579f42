package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// hostsServer is a server with no token, the approvals page and a /mcp
// route, counting the runs and MCP requests that reach it; mutate changes
// its config first.
func hostsServer(t *testing.T, mutate func(*config.Config)) (*Server, *atomic.Int32) {
	t.Helper()
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.Approvals.Page = true
	if mutate != nil {
		mutate(cfg)
	}
	var reached atomic.Int32
	s := New(cfg, func(ctx context.Context, p *task.Plan, h runapi.Hooks) *result.Result {
		reached.Add(1)
		return okRun(ctx, p, h)
	}, nil)
	s.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) }))
	return s, &reached
}

// hostRequest sends method path to base with the Host host ("" for the
// URL's) and the Origin origin ("" for none), and returns the answer's
// status and its JSON error.
func hostRequest(t *testing.T, hc *http.Client, base, method, path, host, origin string) (int, APIError) {
	t.Helper()
	body := ""
	if method == "POST" {
		body = `{"code": "hi"}`
	}
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
		req.Header.Set("Sec-Fetch-Site", "same-origin") // what the browser says of a rebound name
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e APIError
	if resp.StatusCode >= 400 && resp.Header.Get("Content-Type") == "application/json" {
		json.NewDecoder(resp.Body).Decode(&e)
	}
	return resp.StatusCode, e
}

// The endpoints a rebound page could reach.
var hostPaths = []struct{ method, path string }{
	{"POST", "/v1/runs"}, {"POST", "/v1/runs?stream=1"}, {"POST", "/v1/runs/ar-1/approvals/ap-1"},
	{"POST", "/v1/sessions"}, {"GET", "/healthz"}, {"HEAD", "/healthz"}, {"GET", "/metrics"},
	{"GET", "/v1/openapi.json"}, {"POST", "/mcp"}, {"GET", "/mcp"}, {"GET", "/ui/approvals"},
	{"GET", "/ui/approvals.json"}, {"POST", "/ui/decide"}, {"POST", "/ui/login"}, {"GET", "/nowhere"},
}

// TestForeignHostRefused: with no token, a browser's page whose name was
// made to resolve to serve (DNS rebinding, or through a reverse proxy
// that passes the Host on) sends a foreign Host with a matching Origin:
// it is refused 421 on every path before any handler, and a foreign
// Origin with a Host of this server is refused 403, whatever the method.
func TestForeignHostRefused(t *testing.T) {
	s, reached := hostsServer(t, nil)
	ts := startServer(t, s)
	for _, p := range hostPaths {
		for _, tc := range []struct{ host, origin string }{
			{"evil.example", "http://evil.example"},
			{"evil.example:80", ""},
			{"agentrun", ""}, // the unix socket's name only
			{"localhost.evil.example", ""},
			{"127.0.0.1.nip.io", ""},
			{"10.0.0.1", ""},
		} {
			code, e := hostRequest(t, ts.Client(), ts.URL, p.method, p.path, tc.host, tc.origin)
			if code != http.StatusMisdirectedRequest || (p.method != "HEAD" && !strings.Contains(e.Error, "is not a name of this server")) {
				t.Errorf("%s %s with Host %q, Origin %q: %d %q; want 421 naming the Host", p.method, p.path, tc.host, tc.origin, code, e.Error)
			}
		}
		for _, origin := range []string{"http://evil.example", "https://evil.example:443", "null", "http://127.0.0.1.evil.example", "file://"} {
			code, e := hostRequest(t, ts.Client(), ts.URL, p.method, p.path, "", origin)
			if code != http.StatusForbidden || (p.method != "HEAD" && !strings.Contains(e.Error, "is not this server's")) {
				t.Errorf("%s %s with Origin %q: %d %q; want 403 naming the Origin", p.method, p.path, origin, code, e.Error)
			}
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d refused requests reached a run or /mcp", n)
	}
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	for _, tc := range []struct{ host, origin string }{
		{"", ""},
		{"", "http://" + ts.Listener.Addr().String()},
		{"localhost", "http://localhost:8080"},
		{"LocalHost.:" + port, "https://localhost"},
		{"[::1]:" + port, "http://[::1]:1"},
		{"127.0.0.2", "http://127.0.0.1"},
	} {
		if code, e := hostRequest(t, ts.Client(), ts.URL, "POST", "/v1/runs", tc.host, tc.origin); code != 200 {
			t.Errorf("POST /v1/runs with Host %q, Origin %q: %d %q; want 200", tc.host, tc.origin, code, e.Error)
		}
	}
	if n := reached.Load(); n != 6 {
		t.Errorf("%d runs; want the 6 let through", n)
	}
}

// TestServerHostsAllowed: a name of server.hosts, in any case and with
// any port, is this server's as Host and as Origin; the listen address's
// host is too.
func TestServerHostsAllowed(t *testing.T) {
	s, reached := hostsServer(t, func(c *config.Config) {
		c.Server.Hosts = []string{"agentrun.example.com", "2001:db8::7"}
		c.Server.Listen = config.MustAddr("tcp://runner.internal:7070")
	})
	ts := startServer(t, s)
	for _, tc := range []struct{ host, origin string }{
		{"agentrun.example.com", "https://agentrun.example.com"},
		{"AgentRun.Example.COM:8443", "https://agentrun.example.com:8443"},
		{"[2001:db8:0::7]:443", "https://[2001:db8::7]"},
		{"runner.internal:7070", "http://runner.internal:7070"},
		{"localhost", "https://agentrun.example.com"},
	} {
		if code, e := hostRequest(t, ts.Client(), ts.URL, "POST", "/v1/runs", tc.host, tc.origin); code != 200 {
			t.Errorf("Host %q, Origin %q: %d %q; want 200", tc.host, tc.origin, code, e.Error)
		}
	}
	if code, _ := hostRequest(t, ts.Client(), ts.URL, "POST", "/v1/runs", "other.example.com", ""); code != http.StatusMisdirectedRequest {
		t.Errorf("a name not listed: %d; want 421", code)
	}
	if code, _ := hostRequest(t, ts.Client(), ts.URL, "POST", "/v1/runs", "", "https://agentrun.example.com.evil.example"); code != http.StatusForbidden {
		t.Errorf("an Origin that only begins with a listed name: %d; want 403", code)
	}
	if n := reached.Load(); n != 5 {
		t.Errorf("%d runs; want 5", n)
	}
}

// TestUnixSocketHosts: on the unix socket the clients' "agentrun" and
// localhost are this server's names; a foreign name is refused there as
// well, and the Go client's requests (Host "agentrun") pass.
func TestUnixSocketHosts(t *testing.T) {
	s, reached := hostsServer(t, nil)
	sock := filepath.Join(t.TempDir(), "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := s.HTTPServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	c, err := NewClient("unix://"+sock, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatalf("the client's health check: %v", err)
	}
	if res, err := c.Run(context.Background(), []byte(`{"code": "hi"}`)); err != nil || res.Stdout != "hi" {
		t.Fatalf("the client's run: %+v, %v", res, err)
	}
	url, hc := c.HTTP("/mcp")
	resp, err := hc.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the client's /mcp: %v, %v", resp, err)
	}
	resp.Body.Close()
	for host, want := range map[string]int{
		"agentrun": 200, "localhost": 200, "AGENTRUN:80": 200, "127.0.0.1": 200,
		"evil.example": 421, "agentrun.evil.example": 421, "": 421,
	} {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("Host %q: %v", host, err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /healthz with Host %q on the unix socket: %d; want %d", host, resp.StatusCode, want)
		}
	}
	if n := reached.Load(); n != 2 {
		t.Errorf("%d runs and MCP requests; want the client's 2", n)
	}
}

// startServer serves s on a loopback TCP port.
func startServer(t *testing.T, s *Server) *httptest.Server {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = s.HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	return ts
}
