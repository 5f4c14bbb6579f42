package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
)

// guessServer is a server with token t0k and the page on, whose throttle
// of wrong tokens runs on a clock the test moves (advance).
func guessServer(t *testing.T) (srv *Server, ts *httptest.Server, advance func(time.Duration)) {
	t.Helper()
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.Token = "t0k"
	cfg.Server.Approvals.Page = true
	srv = New(cfg, okRun, nil)
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	srv.guesses.now = func() time.Time { return time.Unix(0, now.Load()) }
	ts = httptest.NewUnstartedServer(nil)
	ts.Config = srv.HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	return srv, ts, func(d time.Duration) { now.Add(int64(d)) }
}

// call sends method path with the Authorization header auth (none when
// "") or the form, and returns the answer with its body.
func call(t *testing.T, ts *httptest.Server, method, path, auth string, form url.Values) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, ts.URL+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// wantStatus checks an answer's status, and a 429's Retry-After.
func wantStatus(t *testing.T, what string, resp *http.Response, body string, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s: %d %s; want %d", what, resp.StatusCode, body, want)
	}
	if want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "2" {
		t.Errorf("%s: Retry-After %q; want 2", what, resp.Header.Get("Retry-After"))
	}
}

func TestGuessesThrottled(t *testing.T) {
	srv, ts, advance := guessServer(t)
	get := func(auth string) (*http.Response, string) { return call(t, ts, "GET", "/healthz", auth, nil) }
	// A right token costs nothing, however often.
	for range 3 * guessBurst {
		resp, body := get("Bearer t0k")
		wantStatus(t, "right token", resp, body, 200)
	}
	// No header is no guess.
	for range 3 * guessBurst {
		resp, body := get("")
		wantStatus(t, "no header", resp, body, 401)
	}
	for i := range guessBurst {
		resp, body := get("Bearer nope")
		wantStatus(t, fmt.Sprintf("wrong token %d", i+1), resp, body, 401)
	}
	resp, body := get("Bearer nope")
	wantStatus(t, "wrong token past the burst", resp, body, 429)
	var e APIError
	if json.Unmarshal([]byte(body), &e) != nil || !strings.HasPrefix(e.Error, "too many wrong tokens") {
		t.Errorf("429's body %s", body)
	}
	// The right token is not compared now.
	resp, body = get("Bearer t0k")
	wantStatus(t, "right token while throttled", resp, body, 429)
	resp, body = get("")
	wantStatus(t, "no header while throttled", resp, body, 401)
	// One more guess per guessEvery.
	advance(guessEvery)
	resp, body = get("Bearer nope")
	wantStatus(t, "wrong token a period later", resp, body, 401)
	resp, body = get("Bearer t0k")
	wantStatus(t, "right token after it", resp, body, 429)
	advance(guessEvery)
	resp, body = get("Bearer t0k")
	wantStatus(t, "right token a period later", resp, body, 200)
	resp, body = get("Bearer nope") // the right one left the guess
	wantStatus(t, "wrong token after the right one", resp, body, 401)
	resp, body = get("Bearer nope")
	wantStatus(t, "wrong token once more", resp, body, 429)

	var b strings.Builder
	srv.metrics.WritePrometheus(&b)
	if !strings.Contains(b.String(), "\nagentrun_token_guesses_refused_total 4\n") {
		t.Errorf("metrics:\n%s", b.String())
	}
}

// TestGuessesOnThePage: the page's bearer header and its login form
// count in the same throttle as the API's header; the form past it gets
// the login form again with why, and an empty form is no guess.
func TestGuessesOnThePage(t *testing.T) {
	_, ts, _ := guessServer(t)
	for i := range guessBurst / 2 {
		resp, body := call(t, ts, "GET", "/v1/openapi.json", "Bearer nope", nil)
		wantStatus(t, fmt.Sprintf("API, wrong token %d", i+1), resp, body, 401)
		resp, body = call(t, ts, "POST", "/ui/login", "", url.Values{"token": {"nope"}})
		wantStatus(t, fmt.Sprintf("login, wrong token %d", i+1), resp, body, 401)
	}
	resp, body := call(t, ts, "POST", "/ui/login", "", url.Values{"token": {""}})
	wantStatus(t, "login, empty token", resp, body, 401)
	resp, body = call(t, ts, "POST", "/ui/login", "", url.Values{"token": {"t0k"}})
	wantStatus(t, "login, right token while throttled", resp, body, 429)
	if !strings.Contains(body, `name="token"`) || !strings.Contains(body, "too many wrong tokens") {
		t.Errorf("login's 429 is not the form with why: %s", body)
	}
	for _, path := range []string{uiJSON, uiPage} {
		resp, body = call(t, ts, "GET", path, "Bearer t0k", nil)
		wantStatus(t, path+", right bearer while throttled", resp, body, 429)
		resp, _ = call(t, ts, "GET", path, "", nil)
		if resp.StatusCode == 429 {
			t.Errorf("%s without a token: 429", path)
		}
	}
}

func TestGuessSource(t *testing.T) {
	for addr, want := range map[string][2]string{
		"192.0.2.7:4000":              {"192.0.2.7", "192.0.2.0/24"},
		"[::ffff:192.0.2.7]:4000":     {"192.0.2.7", "192.0.2.0/24"},
		"[2001:db8:1:2:3:4:5:6]:4000": {"2001:db8:1:2::/64", "2001:db8:1::/48"},
		"[2001:db8:1:2::9]:1":         {"2001:db8:1:2::/64", "2001:db8:1::/48"},
		"[fe80::1%eth0]:1":            {"fe80::/64", "fe80::/48"},
		"@":                           {unixSource, unixSource},
		"":                            {unixSource, unixSource},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		if src, prefix := guessSource(r, peers{}); src != want[0] || prefix != want[1] {
			t.Errorf("source of %q: %q in %q; want %q in %q", addr, src, prefix, want[0], want[1])
		}
	}
}

// guessFrom makes one wrong (or right) guess from addr.
func guessFrom(g *guesses, addr string, right bool) (ok bool, wait time.Duration) {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = addr
	return g.try(r, peers{}, func() bool { return right })
}

func TestGuessSourcesApart(t *testing.T) {
	now := time.Now()
	g := &guesses{now: func() time.Time { return now }}
	for range guessBurst {
		guessFrom(g, "[2001:db8::1]:1", false)
	}
	for _, addr := range []string{"[2001:db8::2]:1", "[2001:db8::1]:2"} {
		if _, wait := guessFrom(g, addr, false); wait <= 0 {
			t.Errorf("%s, in the same /64, was not throttled", addr)
		}
	}
	for _, addr := range []string{"[2001:db8:0:1::1]:1", "192.0.2.1:1", "@"} {
		if ok, wait := guessFrom(g, addr, true); !ok || wait > 0 {
			t.Errorf("%s, another source: ok %v, wait %v", addr, ok, wait)
		}
	}
}

// TestGuessSourceEgress: a connection a run's proxy dialled (the client
// and server ends Server.Egress knows) is the sandboxes' one source, not
// its address's: a sandbox out of guesses leaves the operator's clients
// at that address theirs.
func TestGuessSourceEgress(t *testing.T) {
	sandbox := netip.MustParseAddrPort("127.0.0.1:40000")
	isEgress := func(client, server netip.AddrPort) bool { return client == sandbox && server == serveAddr }
	operator := netip.MustParseAddrPort("127.0.0.1:40001")
	if got, _ := guessSource(fromAt(sandbox), peers{egress: isEgress}); got != egressSource {
		t.Errorf("source of the sandbox's connection: %q; want %q", got, egressSource)
	}
	if got, _ := guessSource(fromAt(operator), peers{egress: isEgress}); got != "127.0.0.1" {
		t.Errorf("source of the operator's connection: %q; want 127.0.0.1", got)
	}
	now := time.Now()
	g := &guesses{now: func() time.Time { return now }}
	for range guessBurst + 1 {
		g.try(fromAt(sandbox), peers{egress: isEgress}, func() bool { return false })
	}
	if _, wait := g.try(fromAt(sandbox), peers{egress: isEgress}, func() bool { return true }); wait <= 0 {
		t.Error("the sandbox's guesses were not throttled")
	}
	if ok, wait := g.try(fromAt(operator), peers{egress: isEgress}, func() bool { return true }); !ok || wait > 0 {
		t.Errorf("the operator at the same address after the sandbox's guesses: ok %v, wait %v; want ok", ok, wait)
	}
}

// serveAddr is serve's own address in the tests of local sources.
var serveAddr = netip.MustParseAddrPort("127.0.0.1:7070")

// fromAt is a request accepted from client at serveAddr.
func fromAt(client netip.AddrPort) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = client.String()
	return r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.TCPAddrFromAddrPort(serveAddr)))
}

// TestGuessSourceLocalUser: a TCP client on the host's loopback whose
// socket's owner Server.PeerUID tells is a source of that user's: a tool
// server (another user of the host) that spends its guesses, 14 wrong
// tokens, leaves the operator at the same address theirs.
func TestGuessSourceLocalUser(t *testing.T) {
	tool := netip.MustParseAddrPort("127.0.0.1:40000")
	operator := netip.MustParseAddrPort("127.0.0.1:40001")
	stranger := netip.MustParseAddrPort("127.0.0.1:40002")
	owners := map[netip.AddrPort]uint32{tool: 2000000007, operator: 1000}
	known := peers{uid: func(client, server netip.AddrPort) (uint32, bool) {
		uid, ok := owners[client]
		return uid, ok && server == serveAddr
	}}
	for client, want := range map[netip.AddrPort][2]string{
		tool:     {"local uid 2000000007", localSource},
		operator: {"local uid 1000", localSource},
		stranger: {"127.0.0.1", "127.0.0.0/24"}, // its user untold: its address
	} {
		if src, prefix := guessSource(fromAt(client), known); src != want[0] || prefix != want[1] {
			t.Errorf("source of %s: %q in %q; want %q in %q", client, src, prefix, want[0], want[1])
		}
	}
	now := time.Now()
	g := &guesses{now: func() time.Time { return now }}
	for range 14 {
		g.try(fromAt(tool), known, func() bool { return false })
	}
	if _, wait := g.try(fromAt(tool), known, func() bool { return true }); wait <= 0 {
		t.Error("the tool server's guesses were not throttled")
	}
	if ok, wait := g.try(fromAt(operator), known, func() bool { return true }); !ok || wait > 0 {
		t.Errorf("the operator at the same address after the tool server's 14 wrong tokens: ok %v, wait %v; want ok", ok, wait)
	}
}

// TestRootUnixSocketUsers: every client of the unix socket is a source
// of its user's (SO_PEERCRED): another user of the host (here curl as uid
// 2000000007, as a tool server would be) that sends 14 wrong tokens is
// throttled, and the operator (root) right after is served.
func TestRootUnixSocketUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("AGENTRUN_TEST_ROOT") == "1" {
			t.Fatal("needs root: a client of the socket as another user ($AGENTRUN_TEST_ROOT=1)")
		}
		t.Skip("needs root: a client of the socket as another user")
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl: ", err)
	}
	srv, _, _ := guessServer(t)
	dir, err := os.MkdirTemp("", "agentrun-guesses-") // t.TempDir's parent is root's alone
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "serve.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	hs := srv.HTTPServer()
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	status := func(uid uint32, token string) string {
		t.Helper()
		cmd := exec.Command(curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", sock,
			"-H", "Authorization: Bearer "+token, "http://localhost/v1/sessions")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl as %d: %v", uid, err)
		}
		return string(out)
	}
	for i := range 14 {
		if got := status(2000000007, fmt.Sprintf("wrong-%d", i)); got != "401" && got != "429" {
			t.Fatalf("wrong token %d: %s", i, got)
		}
	}
	if got := status(2000000007, "t0k"); got != "429" {
		t.Errorf("the other user's right token after 14 wrong ones: %s; want 429", got)
	}
	if got := status(0, "t0k"); got == "429" || got == "401" {
		t.Errorf("the operator after another user's 14 wrong tokens: %s; want served", got)
	}
}

// TestGuessSourcesBounded: past maxGuessSources, new sources share the
// overflow limiter until the remembered ones are full again.
func TestGuessSourcesBounded(t *testing.T) {
	now := time.Now()
	g := &guesses{now: func() time.Time { return now }}
	// Each in a /24 of its own: no prefix's share is reached.
	addr := func(i int) string { return fmt.Sprintf("10.%d.%d.1:1", i>>8&255, i&255) }
	for i := range maxGuessSources {
		guessFrom(g, addr(i), false)
	}
	// A right token from a new source is not remembered.
	guessFrom(g, "192.0.2.1:1", true)
	if len(g.sources) != maxGuessSources {
		t.Fatalf("%d sources; want %d", len(g.sources), maxGuessSources)
	}
	// New sources share one limiter.
	for i := range guessBurst {
		if _, wait := guessFrom(g, addr(maxGuessSources+i), false); wait > 0 {
			t.Fatalf("overflow guess %d throttled", i+1)
		}
	}
	if _, wait := guessFrom(g, addr(maxGuessSources+guessBurst), false); wait <= 0 {
		t.Error("new sources past the table were not throttled together")
	}
	if len(g.sources) > maxGuessSources {
		t.Errorf("%d sources remembered, more than %d", len(g.sources), maxGuessSources)
	}
	// The remembered ones are throttled on their own still.
	if _, wait := guessFrom(g, addr(0), false); wait > 0 {
		t.Error("a remembered source was throttled with the overflow")
	}
	// Once they are full again, they go and a new source has its own.
	now = now.Add(guessBurst * guessEvery)
	if _, wait := guessFrom(g, addr(maxGuessSources+guessBurst+1), false); wait > 0 {
		t.Error("a new source was throttled after the table emptied")
	}
	if len(g.sources) != 1 {
		t.Errorf("%d sources after the sweep; want 1", len(g.sources))
	}
}

// TestBearerSchemeAnyCase: the Bearer scheme is case-insensitive (RFC
// 9110 §11.1), on every path that reads the header: the API, /metrics,
// /mcp and the page. A right token so spelled is no wrong guess, however
// often; a wrong one is.
func TestBearerSchemeAnyCase(t *testing.T) {
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.Token = "t0k"
	cfg.Server.Approvals.Page = true
	srv := New(cfg, okRun, nil)
	srv.Handle("/mcp", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = srv.HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	for _, path := range []string{"/healthz", "/metrics", "/v1/openapi.json", "/mcp", uiJSON, uiPage} {
		for range guessBurst {
			for _, auth := range []string{"bearer t0k", "BEARER t0k", "BeArEr t0k", "bearer  t0k"} {
				resp, body := call(t, ts, "GET", path, auth, nil)
				wantStatus(t, path+" with "+auth, resp, body, 200)
			}
		}
	}
	resp, body := call(t, ts, "GET", "/healthz", "bearer nope", nil)
	wantStatus(t, "a wrong token in lower case", resp, body, 401)
	resp, body = call(t, ts, "GET", "/healthz", "Basic t0k", nil)
	wantStatus(t, "another scheme", resp, body, 401)
}

func TestBearerCredentials(t *testing.T) {
	for h, want := range map[string]string{
		"":              "",
		"bearer x":      "Bearer x",
		"Bearer x":      "Bearer x",
		"bEaReR   x":    "Bearer x",
		"Basic x":       "Basic x",
		"Bearerx":       "Bearerx",
		"bearer":        "bearer",
		"Bearer x y":    "Bearer x y",
		"Bearer\tx":     "Bearer\tx",
		"Negotiate abc": "Negotiate abc",
	} {
		if got := bearerCredentials(h); got != want {
			t.Errorf("bearerCredentials(%q) = %q; want %q", h, got, want)
		}
	}
}

// TestGuessPrefixFloodStaysInItsShare: more /64s of one /48 guessing
// than the table holds (a /52 alone fills it) fill no more than their prefix's share of the table and, past
// it, share their prefix's own overflow limiter; a client of another
// prefix still gets a limiter of its own, not one the flood spent.
func TestGuessPrefixFloodStaysInItsShare(t *testing.T) {
	now := time.Now()
	g := &guesses{now: func() time.Time { return now }}
	flood := func(i int) string { return fmt.Sprintf("[2001:db8:0:%x::1]:1", i) } // in 2001:db8::/48
	for i := range maxGuessSources + 100 {
		for range guessBurst + 1 {
			guessFrom(g, flood(i), false)
		}
	}
	if len(g.sources) > maxGuessSourcesPerPrefix {
		t.Errorf("one /48 holds %d sources of the table; want at most %d", len(g.sources), maxGuessSourcesPerPrefix)
	}
	if _, wait := guessFrom(g, flood(maxGuessSources+200), false); wait <= 0 {
		t.Error("a new /64 of the flooding /48 was not throttled with the rest of the flood")
	}
	for _, addr := range []string{"[2001:db8:1::1]:1", "[2001:db9::1]:1", "192.0.2.1:1", "@"} {
		for i := range guessBurst {
			if _, wait := guessFrom(g, addr, false); wait > 0 {
				t.Fatalf("%s, another prefix: wrong guess %d throttled by the flood (wait %v)", addr, i+1, wait)
			}
		}
		if _, wait := guessFrom(g, addr, false); wait <= 0 {
			t.Errorf("%s was not throttled after %d wrong guesses", addr, guessBurst)
		}
	}
	// Once the flood's limiters are full again, its prefix is forgotten.
	now = now.Add(guessBurst * guessEvery)
	if _, wait := guessFrom(g, "[2001:db8:0:ffff::1]:1", false); wait > 0 {
		t.Error("a new /64 of the flood's prefix was throttled after the flood was over")
	}
	if p := g.prefixes["2001:db8::/48"]; p == nil || p.n != 1 {
		t.Errorf("the flood's prefix after the sweep: %+v; want 1 source", p)
	}
}

// TestGuessPrefixIPv4Share: an IPv4 /24 has the same share.
func TestGuessPrefixIPv4Share(t *testing.T) {
	now := time.Now()
	g := &guesses{now: func() time.Time { return now }}
	for i := range 256 {
		for range guessBurst + 1 {
			guessFrom(g, fmt.Sprintf("198.51.100.%d:1", i), false)
		}
	}
	if len(g.sources) != maxGuessSourcesPerPrefix {
		t.Errorf("one /24 holds %d sources; want its share, %d", len(g.sources), maxGuessSourcesPerPrefix)
	}
	if ok, wait := guessFrom(g, "198.51.101.1:1", true); !ok || wait > 0 {
		t.Errorf("another /24: ok %v, wait %v", ok, wait)
	}
}
