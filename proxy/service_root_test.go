//go:build linux

package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

const testSecret = "s3cret-0123456789abcdef"

func newServiceRun(t *testing.T, approve approvals.Func, timeout time.Duration) (*run, *proxytest.HeaderLog) {
	t.Helper()
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	// The upstream API keeps the Authorization headers it receives and
	// answers without echoing them.
	rc := &proxytest.HeaderLog{Name: "Authorization"}
	in.Mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		rc.Record(r)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "api %s %s body=%q", r.Method, r.URL.EscapedPath(), b)
	})
	secret := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(secret, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := Policy{
		Allow:       allowOf("www.internet.test"),
		Hosts:       map[string]netip.Addr{"api.internet.test": in.IP, "www.internet.test": in.IP, "plain.internet.test": in.IP},
		AllowRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		Services: validated([]netpolicy.Service{{
			Name: "api", URL: "https://api.internet.test",
			Inject: []netpolicy.Inject{{Header: "Authorization", Prefix: "Bearer ", File: secret}},
			Rules: []netpolicy.Rule{
				{Methods: []string{"GET"}, Paths: []string{"/api/read/**"}},
				{Methods: []string{"POST"}, Paths: []string{"/api/write/*"}, Approve: true},
				{Methods: []string{"*"}, Paths: []string{"/api/any/**"}},
			},
		}, {
			Name: "plain", URL: "http://plain.internet.test",
			Inject: []netpolicy.Inject{{Header: "Authorization", Prefix: "Token ", File: secret}},
			Rules: []netpolicy.Rule{
				{Methods: []string{"GET"}, Paths: []string{"/api/**"}},
				{Methods: []string{"POST"}, Paths: []string{"/api/write/*"}, Approve: true},
			},
		}}),
		UpstreamRoots:   in.Roots,
		Approve:         approve,
		ApprovalTimeout: timeout,
	}
	return startRun(t, in, p), rc
}

// serviceClient talks to services through the explicit proxy, trusting
// the run's CA only.
func (r *run) serviceClient() *http.Client {
	c := r.explicitClient()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(r.px.CACert()) {
		r.t.Fatal("run CA certificate does not parse")
	}
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
	return c
}

// rawService sends request line line (exact bytes) to the service host
// through CONNECT and TLS, and returns the status and body.
func (r *run) rawService(line string) (int, string) {
	r.t.Helper()
	return r.rawServiceBody(line, "")
}

// rawServiceBody is rawService with a request body.
func (r *run) rawServiceBody(line, body string) (int, string) {
	r.t.Helper()
	_, _, c := r.connect("api.internet.test:443")
	if c == nil {
		r.t.Fatal("CONNECT api.internet.test:443 refused")
	}
	defer c.Close()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.px.CACert())
	tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "api.internet.test"})
	fmt.Fprintf(tc, "%s\r\nHost: api.internet.test\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", line, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		r.t.Fatalf("%s: %v", line, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServiceInjectionAndRules(t *testing.T) {
	r, rc := newServiceRun(t, nil, 0)
	c := r.serviceClient()

	code, body, _ := get(t, c, "https://api.internet.test/api/read/x")
	if code != 200 || body != `api GET /api/read/x body=""` {
		t.Fatalf("GET allowed path = %d %q", code, body)
	}
	if got := rc.Got(); len(got) != 1 || got[0] != "Bearer "+testSecret {
		t.Fatalf("upstream saw Authorization %q; want the injected one", got)
	}
	// A header the program sets is replaced, not added to.
	req, _ := http.NewRequest("GET", "https://api.internet.test/api/read/y", nil)
	req.Header.Set("Authorization", "Bearer mine")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := rc.Got(); got[len(got)-1] != "Bearer "+testSecret {
		t.Errorf("upstream saw %q after the program set its own", got[len(got)-1])
	}
	// Plain http:// to an http service, absolute form.
	code, body, _ = get(t, r.explicitClient(), "http://plain.internet.test/api/p")
	if code != 200 || !strings.Contains(body, "/api/p") {
		t.Errorf("GET plain service = %d %q", code, body)
	}
	if got := rc.Got(); got[len(got)-1] != "Token "+testSecret {
		t.Errorf("plain upstream saw %q", got[len(got)-1])
	}
	// The transparent path reaches the same logic.
	tr := r.transparentClient()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.px.CACert())
	tr.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
	code, body, _ = get(t, tr, "https://api.internet.test/api/read/t")
	if code != 200 || !strings.Contains(body, "/api/read/t") {
		t.Errorf("transparent GET = %d %q", code, body)
	}
	code, _, _ = get(t, tr, "https://api.internet.test/api/other")
	if code != 403 {
		t.Errorf("transparent GET of a path no rule allows = %d; want 403", code)
	}
	n := len(rc.Got())

	resp, err = c.Post("https://api.internet.test/api/read/x", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(b), "no rule of service api allows POST /api/read/x") {
		t.Errorf("POST to a GET-only path = %d %q; want 403", resp.StatusCode, b)
	}
	for _, line := range []string{
		"GET /api/other HTTP/1.1",
		"DELETE /api/read/x HTTP/1.1",
		"GET /api/read/../../admin HTTP/1.1",
		"GET /api/read/%2e%2e/%2e%2e/admin HTTP/1.1",
		"GET /api/read/..%2f..%2fadmin HTTP/1.1",
		"GET /api/read//x HTTP/1.1",
		"GET //api/read/x HTTP/1.1",
		"GET /API/READ/x HTTP/1.1",
		"GET /Api/read/x HTTP/1.1",
		"get /api/read/x HTTP/1.1",
		"GET https://evil.example/api/read/x HTTP/1.1",
	} {
		if code, body := r.rawService(line); code != 403 && code != 400 {
			t.Errorf("%s = %d %q; want 403", line, code, body)
		}
	}
	if got := rc.Got(); len(got) != n {
		t.Errorf("refused requests reached upstream: %d more", len(got)-n)
	}
	// POST with an approve rule and no approver: denied by the operator.
	resp, err = c.Post("https://api.internet.test/api/write/x", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || strings.TrimSpace(string(b)) != "agentrun: denied by the operator" {
		t.Errorf("held POST without approver = %d %q", resp.StatusCode, b)
	}

	rep := r.px.Report()
	js, _ := json.Marshal(rep)
	if strings.Contains(string(js), testSecret) {
		t.Errorf("report holds the secret: %s", js)
	}
	var injected, denied bool
	for _, q := range rep.Requests {
		if q.Allowed && len(q.Injected) == 1 && q.Injected[0] == "Authorization" {
			injected = true
		}
		if !q.Allowed && q.Method == "DELETE" {
			denied = true
		}
	}
	if !injected || !denied {
		t.Errorf("report requests lack the injection or the denial: %s", js)
	}
	if len(rep.Approvals) != 1 || rep.Approvals[0].Approved || rep.Approvals[0].By != "no way to ask" {
		t.Errorf("approvals = %+v; want one denied, no way to ask", rep.Approvals)
	}
}

func TestServiceBlindTunnelAndCA(t *testing.T) {
	r, rc := newServiceRun(t, nil, 0)
	// www.internet.test is not a service: CONNECT is a blind tunnel and the
	// program sees the upstream's own certificate.
	_, _, c := r.connect("www.internet.test:443")
	if c == nil {
		t.Fatal("CONNECT www.internet.test:443 refused")
	}
	tc := tls.Client(c, &tls.Config{RootCAs: r.in.Roots, ServerName: "www.internet.test"})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake through blind tunnel: %v", err)
	}
	leaf := tc.ConnectionState().PeerCertificates[0]
	if leaf.Subject.CommonName != "internet.test" || leaf.Issuer.CommonName == r.px.ca.Certificate().Subject.CommonName {
		t.Errorf("blind tunnel shows %q issued by %q; want the upstream's own", leaf.Subject.CommonName, leaf.Issuer.CommonName)
	}
	tc.Close()
	// The service shows a certificate from the run's CA.
	_, _, c = r.connect("api.internet.test:443")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.px.CACert())
	tc = tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "api.internet.test"})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake with service: %v", err)
	}
	tc.Close()
	// A service port other than the service's is not the service.
	if resp, _, _ := r.connect("api.internet.test:8443"); resp.StatusCode != 403 {
		t.Errorf("CONNECT api.internet.test:8443 = %d; want 403", resp.StatusCode)
	}
	// A new run gets a new CA.
	r2 := startRun(t, r.in, r.px.policy)
	if string(r2.px.CACert()) == string(r.px.CACert()) {
		t.Errorf("two runs share a CA")
	}
	// An upstream the roots do not trust is refused.
	p := r.px.policy
	p.UpstreamRoots = x509.NewCertPool()
	r3 := startRun(t, r.in, p)
	code, body, _ := get(t, r3.serviceClient(), "https://api.internet.test/api/read/x")
	if code != 502 || !strings.Contains(body, "upstream certificate not trusted") {
		t.Errorf("untrusted upstream = %d %q; want 502", code, body)
	}
	_ = rc
}

func TestServiceApproval(t *testing.T) {
	asks := make(chan approvals.Approval, 8)
	answers := make(chan bool, 8)
	approve := func(ctx context.Context, a approvals.Approval) approvals.Decision {
		asks <- a
		select {
		case ok := <-answers:
			return approvals.Decision{Approved: ok, By: "test operator"}
		case <-ctx.Done():
			return approvals.Decision{}
		}
	}
	r, rc := newServiceRun(t, approve, 2*time.Second)
	c := r.serviceClient()
	post := func() (int, string) {
		resp, err := c.Post("https://api.internet.test/api/write/x?q=1", "text/plain", strings.NewReader("payload"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type answer struct {
		code int
		body string
	}
	for _, tc := range []struct {
		name   string
		decide func()
		want   int
		by     string
	}{
		{"granted", func() { answers <- true }, 200, "test operator"},
		{"denied", func() { answers <- false }, 403, "test operator"},
		{"timed out", func() {}, 403, "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan answer, 1)
			go func() { code, body := post(); done <- answer{code, body} }()
			a := <-asks
			if a.Method != "POST" || a.URL != "https://api.internet.test/api/write/x?q=1" || a.BodyExcerpt != "payload" || a.Service != "api" {
				t.Errorf("approval asked = %+v", a)
			}
			if r.px.Held() != 1 {
				t.Errorf("held = %d while asking; want 1", r.px.Held())
			}
			tc.decide()
			got := <-done
			if got.code != tc.want {
				t.Errorf("status = %d %q; want %d", got.code, got.body, tc.want)
			}
			if tc.want == 200 && got.body != `api POST /api/write/x body="payload"` {
				t.Errorf("upstream's answer = %q", got.body)
			}
			if tc.want == 403 && strings.TrimSpace(got.body) != "agentrun: denied by the operator" {
				t.Errorf("denial body = %q", got.body)
			}
			recs := r.px.Report().Approvals
			last := recs[len(recs)-1]
			if last.ID != a.ID || last.By != tc.by || last.Approved != (tc.want == 200) {
				t.Errorf("approval record = %+v; want by %q", last, tc.by)
			}
		})
	}
	if n := len(rc.Got()); n != 1 {
		t.Errorf("upstream got %d requests; want only the granted one", n)
	}

	t.Run("client gone while held", func(t *testing.T) {
		_, _, conn := r.connect("api.internet.test:443")
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(r.px.CACert())
		tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: "api.internet.test"})
		fmt.Fprintf(tc, "POST /api/write/y HTTP/1.1\r\nHost: api.internet.test\r\nContent-Length: 2\r\n\r\nhi")
		a := <-asks
		tc.Close()
		deadline := time.Now().Add(5 * time.Second)
		for r.px.Held() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if h := r.px.Held(); h != 0 {
			t.Fatalf("held = %d after the client went; want 0", h)
		}
		recs := r.px.Report().Approvals
		if last := recs[len(recs)-1]; last.ID != a.ID || last.Approved || last.By != "request abandoned" {
			t.Errorf("record = %+v; want abandoned", last)
		}
	})
	t.Run("run ends while held", func(t *testing.T) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := c.Post("https://api.internet.test/api/write/z", "text/plain", strings.NewReader("z"))
			if err == nil {
				resp.Body.Close()
			}
		}()
		<-asks
		r.px.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("held request still waiting after Close")
		}
		if h := r.px.Held(); h != 0 {
			t.Errorf("held = %d after Close", h)
		}
	})
	_ = net.ErrClosed
}

// benchRun is a run with service "api" and blind access to
// www.internet.test, both served by the same fake upstream.
func benchRun(b *testing.B) (*run, *tls.Config, *tls.Config) {
	b.Helper()
	testenv.RequireRoot(b)
	in := proxytest.NewInternet(b)
	secret := filepath.Join(b.TempDir(), "token")
	os.WriteFile(secret, []byte("bench-token\n"), 0o600)
	p := Policy{
		Allow:       allowOf("www.internet.test"),
		Hosts:       map[string]netip.Addr{"api.internet.test": in.IP, "www.internet.test": in.IP},
		AllowRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		Services: validated([]netpolicy.Service{{Name: "api", URL: "https://api.internet.test",
			Inject: []netpolicy.Inject{{Header: "Authorization", Prefix: "Bearer ", File: secret}},
			Rules:  []netpolicy.Rule{{Methods: []string{"GET"}, Paths: []string{"/hello"}}}}}),
		UpstreamRoots: in.Roots,
	}
	n, err := subnets.Setup()
	if err != nil {
		b.Fatal(err)
	}
	px, err := Start(n, p)
	if err != nil {
		n.Close()
		b.Fatal(err)
	}
	r := &run{n: n, px: px, gw: n.Gateway.String(), in: in}
	b.Cleanup(func() { px.Close(); n.Close() })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(px.CACert())
	return r, &tls.Config{RootCAs: pool}, &tls.Config{RootCAs: in.Roots}
}

// benchClient is a sandbox client through the explicit proxy; keepAlive
// reuses its connection between requests.
func (r *run) benchClient(tc *tls.Config, keepAlive bool) *http.Client {
	tr := &http.Transport{
		Proxy:             func(*http.Request) (*url.URL, error) { return url.Parse(r.px.Env()["HTTPS_PROXY"]) },
		DialContext:       r.dial,
		TLSClientConfig:   tc,
		DisableKeepAlives: !keepAlive,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func benchGet(b *testing.B, c *http.Client, u string) {
	for b.Loop() {
		resp, err := c.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}

// BenchmarkServiceRequest is one HTTPS GET to a service (CONNECT, TLS
// with the run's CA, rule check, injection, TLS to the upstream), a new
// connection each (NewConn) or over one kept connection (KeepAlive);
// BenchmarkTunnelRequest is the same GET to the same upstream through a
// blind CONNECT tunnel. The difference is what interception adds.
func BenchmarkServiceRequest(b *testing.B) {
	r, svcTLS, _ := benchRun(b)
	b.Run("NewConn", func(b *testing.B) { benchGet(b, r.benchClient(svcTLS, false), "https://api.internet.test/hello") })
	b.Run("KeepAlive", func(b *testing.B) { benchGet(b, r.benchClient(svcTLS, true), "https://api.internet.test/hello") })
}

func BenchmarkTunnelRequest(b *testing.B) {
	r, _, upTLS := benchRun(b)
	b.Run("NewConn", func(b *testing.B) { benchGet(b, r.benchClient(upTLS, false), "https://www.internet.test/hello") })
	b.Run("KeepAlive", func(b *testing.B) { benchGet(b, r.benchClient(upTLS, true), "https://www.internet.test/hello") })
}

// hostileBody is a held request's body that, shown raw, would end the
// question, clear the screen and reverse the text after it.
const hostileBody = "{\"title\":\"hi\"}\n\nApprove this request?\n\x1b[2J\x1b[H\u202eThe sandboxed program asks to send GET https://svc.test/public/readme\u200b\x00\x7f\u0085\xff"

// approvingRun is a service run whose approver approves every held
// request, handing it to the channel first.
func approvingRun(t *testing.T) (*run, chan approvals.Approval) {
	asks := make(chan approvals.Approval, 8)
	approve := func(ctx context.Context, a approvals.Approval) approvals.Decision {
		asks <- a
		return approvals.Decision{Approved: true, By: "test operator"}
	}
	r, _ := newServiceRun(t, approve, 5*time.Second)
	return r, asks
}

// TestServiceApprovalShown: what the approver is shown of a held request
// carries no byte of the program's that draws anything but itself, the
// URL is shown and recorded whole, one too long to show is refused before
// anyone is asked, and the upstream gets the request as sent.
func TestServiceApprovalShown(t *testing.T) {
	r, asks := approvingRun(t)
	c := r.serviceClient()
	post := func(u, body string) (int, string) {
		t.Helper()
		resp, err := c.Post(u, "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	showable := func(a approvals.Approval) {
		t.Helper()
		for name, v := range map[string]string{"method": a.Method, "url": a.URL, "body_excerpt": a.BodyExcerpt} {
			if bad := proxytest.Unshowable(v); bad != "" {
				t.Errorf("approval %s %q holds %s", name, v, bad)
			}
		}
	}

	// A hostile body (and a right-to-left override in the path, as raw
	// bytes and percent-encoded).
	code, body := r.rawServiceBody("POST /api/write/x\u202ey%e2%80%ae?q=\u202e HTTP/1.1", hostileBody)
	a := <-asks
	showable(a)
	wantURL := `https://api.internet.test/api/write/x\u202ey%e2%80%ae?q=\u202e`
	wantBody := `{"title":"hi"}\n\nApprove this request?\n\x1b[2J\x1b[H\u202eThe sandboxed program asks to send GET https://svc.test/public/readme\u200b\x00\x7f\u0085\xff`
	if a.URL != wantURL || a.BodyExcerpt != wantBody || a.BodyCut {
		t.Errorf("approval shown:\n url  %s\n body %s (cut %v)\nwant\n url  %s\n body %s", a.URL, a.BodyExcerpt, a.BodyCut, wantURL, wantBody)
	}
	if want := fmt.Sprintf("body=%q", hostileBody); code != 200 || !strings.HasSuffix(body, want) {
		t.Errorf("upstream's answer = %d %q; want one ending in %q (the body as sent)", code, body, want)
	}
	if got := r.in.Received(); got[len(got)-1] != "POST /api/write/x\u202ey%e2%80%ae?q=\u202e" {
		t.Errorf("upstream got %q; want the request line as sent", got[len(got)-1])
	}
	// A long body: its start, marked as cut.
	post("https://api.internet.test/api/write/long", strings.Repeat("b", 5000))
	if a := <-asks; len(a.BodyExcerpt) != bodyExcerpt || !a.BodyCut {
		t.Errorf("long body: excerpt of %d bytes, cut %v; want %d, true", len(a.BodyExcerpt), a.BodyCut, bodyExcerpt)
	}

	// A URL past 255 bytes is shown and recorded whole.
	long := "/api/write/trusted-org" + strings.Repeat("-", 240) + "-attacker-repo-issues"
	if code, body := post("https://api.internet.test"+long, "x"); code != 200 || !strings.Contains(body, long) {
		t.Errorf("long URL: %d %q", code, body)
	}
	if a := <-asks; a.URL != "https://api.internet.test"+long {
		t.Errorf("long URL shown as %q", a.URL)
	}
	rep := r.px.Report()
	if got := rep.Requests[len(rep.Requests)-1]; got.Path != long || !got.Allowed {
		t.Errorf("long URL recorded as %+v", got)
	}
	if got := rep.Approvals[len(rep.Approvals)-1]; got.URL != "https://api.internet.test"+long {
		t.Errorf("long URL's approval recorded as %+v", got)
	}

	// One too long to show is refused before anyone is asked.
	before := len(r.in.Received())
	tooLong := "/api/write/" + strings.Repeat("a", MaxURLBytes)
	code, body = post("https://api.internet.test"+tooLong, "x")
	if code != 403 || !strings.Contains(body, "URL longer than 2048 bytes") {
		t.Errorf("URL of %d bytes: %d %q; want 403", len(tooLong), code, body)
	}
	select {
	case a := <-asks:
		t.Errorf("asked about a URL too long to show: %.80s", a.URL)
	default:
	}
	if n := len(r.in.Received()); n != before {
		t.Errorf("upstream got %d requests for a URL too long to show", n-before)
	}
	rep = r.px.Report()
	if got := rep.Requests[len(rep.Requests)-1]; got.Allowed || !strings.Contains(got.Path, "…[cut: ") || len(got.Path) > 512 {
		t.Errorf("refused long URL recorded as %.600s", got.Path)
	}
}

// TestServiceApprovalDuplicateKeys: a held request whose body a server
// may read as JSON and that holds a key twice in an object (or is too
// long to check) is refused with 403 before anyone is asked and never
// sent; a JSON body without one is asked about, shown escaped, and sent.
func TestServiceApprovalDuplicateKeys(t *testing.T) {
	r, asks := approvingRun(t)
	c := r.serviceClient()
	post := func(ctype, body string) (int, string) {
		t.Helper()
		resp, err := c.Post("https://api.internet.test/api/write/mail", ctype, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	before := len(r.in.Received())
	for _, b := range []struct{ ctype, body, reason string }{
		{"application/json", `{"to":"alice@example.com","subject":"hi","to":"mallory@example.com"}`, "key /to appears twice"},
		{"text/plain", `{"msg":{"to":"alice","TO":"mallory"}}`, "key /msg/TO appears twice in its object, in other letter case"},
		{"application/json", `{"to":"alice","pad":"` + strings.Repeat("x", MaxJSONBytes) + `","to":"mallory"}`, "JSON body longer than 65536 bytes"},
	} {
		code, body := post(b.ctype, b.body)
		if code != 403 || !strings.Contains(body, b.reason) {
			t.Errorf("%s %.60s = %d %q; want 403 saying %q", b.ctype, b.body, code, body, b.reason)
		}
	}
	select {
	case a := <-asks:
		t.Errorf("asked about a body with a key twice: %.200s", a.BodyExcerpt)
	default:
	}
	if n := len(r.in.Received()); n != before {
		t.Errorf("upstream got %d requests with a key twice: %q", n-before, r.in.Received()[before:])
	}
	rep := r.px.Report()
	if got := rep.Requests[len(rep.Requests)-1]; got.Allowed || !strings.Contains(got.Reason, "JSON body longer") {
		t.Errorf("refused body recorded as %+v", got)
	}

	// Without a key twice: asked, shown escaped, sent as it is.
	sent := "{\"to\":\"alice\ufe0f\u3164\U000e0100\"}"
	if code, body := post("application/json", sent); code != 200 || !strings.HasSuffix(body, fmt.Sprintf("body=%q", sent)) {
		t.Errorf("a JSON body = %d %q; want it sent", code, body)
	}
	if a := <-asks; a.BodyExcerpt != `{"to":"alice\ufe0f\u3164\U000e0100"}` {
		t.Errorf("a JSON body shown as %q", a.BodyExcerpt)
	}
}

// A decision its decider was told was taken counts, even when the
// approval's time ran out before the approver returned it: the request
// is sent and recorded as decided, never as timed out.
func TestServiceApprovalTakenAtTimeout(t *testing.T) {
	approve := func(ctx context.Context, a approvals.Approval) approvals.Decision {
		<-ctx.Done() // taken at the last moment, returned just after
		return approvals.Decision{Approved: true, By: "operator (late)", Taken: true}
	}
	r, rc := newServiceRun(t, approve, 200*time.Millisecond)
	resp, err := r.serviceClient().Post("https://api.internet.test/api/write/x", "text/plain", strings.NewReader("p"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(rc.Got()) != 1 {
		t.Errorf("answer %d %q, upstream got %d requests; want 200 and the request sent", resp.StatusCode, b, len(rc.Got()))
	}
	recs := r.px.Report().Approvals
	if len(recs) != 1 || !recs[0].Approved || !recs[0].Taken || recs[0].By != "operator (late)" {
		t.Errorf("approval records = %+v; want one approved by operator (late), taken", recs)
	}
}

// TRACE and TRACK, which a server answers with the request it got (the
// injected credential included), are refused whatever the rules say, "*"
// included; so is a "#" anywhere in the target, or a "#" or "?" encoded
// once or twice in the path, which a server reads as a shorter path than
// the one matched. The record holds the path with its query.
func TestServiceEchoMethodsAndDelimiters(t *testing.T) {
	r, rc := newServiceRun(t, func(ctx context.Context, a approvals.Approval) approvals.Decision {
		t.Errorf("asked about %s %s", a.Method, a.URL)
		return approvals.Decision{By: "test operator"}
	}, 5*time.Second)
	if code, body := r.rawService("DELETE /api/any/x?a=1&b=%22 HTTP/1.1"); code != 200 {
		t.Fatalf("DELETE under a \"*\" rule: %d %q; want 200", code, body)
	}
	rep := r.px.Report()
	if got := rep.Requests[len(rep.Requests)-1]; got.Path != "/api/any/x?a=1&b=%22" || !got.Allowed {
		t.Errorf("request with a query recorded as %+v; want its path with the query", got)
	}
	for _, tc := range []struct{ line, reason string }{
		{"TRACE /api/any/x HTTP/1.1", "echoes the request"},
		{"trace /api/any/x HTTP/1.1", "echoes the request"},
		{"TRACK /api/any/x HTTP/1.1", "echoes the request"},
		{"TrAcK /api/read/x HTTP/1.1", "echoes the request"},
		{"GET /api/read/x#/y HTTP/1.1", "#"},
		{"GET /api/read/x?q=1#y HTTP/1.1", "#"},
		{"GET /api/read/x%23/y HTTP/1.1", "encoded # or ?"},
		{"GET /api/read/x%3f/y HTTP/1.1", "encoded # or ?"},
		{"GET /api/read/x%3F/y HTTP/1.1", "encoded # or ?"},
		{"GET /api/read/x%2523/y HTTP/1.1", "encoded twice"},
		{"GET /api/read/x%253F/y HTTP/1.1", "encoded twice"},
		{"GET /api/read/x%253f/y HTTP/1.1", "encoded twice"},
	} {
		before := len(rc.Got())
		code, body := r.rawService(tc.line)
		if code != 403 || !strings.Contains(body, tc.reason) || strings.Contains(strings.TrimSuffix(body, "\n"), "\n") {
			t.Errorf("%s: %d %q; want 403 saying %q in one line", tc.line, code, body, tc.reason)
		}
		if n := len(rc.Got()); n != before {
			t.Errorf("%s: sent upstream", tc.line)
		}
		rep := r.px.Report()
		if got := rep.Requests[len(rep.Requests)-1]; got.Allowed || !strings.Contains(got.Reason, tc.reason) {
			t.Errorf("%s recorded as %+v", tc.line, got)
		}
	}
}

// A header that servers read as the request's real method or path is
// refused before any rule or approver sees the request: the method and
// path matched and shown are the ones the service acts on.
func TestServiceOverrideHeaders(t *testing.T) {
	asks := make(chan approvals.Approval, 8)
	r, rc := newServiceRun(t, func(ctx context.Context, a approvals.Approval) approvals.Decision {
		asks <- a
		return approvals.Decision{Approved: true, By: "test operator"}
	}, 5*time.Second)
	c := r.serviceClient()
	for _, tc := range []struct{ method, path, header, value string }{
		{"GET", "/api/read/x", "X-HTTP-Method-Override", "DELETE"},
		{"POST", "/api/write/x", "X-Http-Method", "DELETE"},
		{"POST", "/api/write/x", "x-method-override", "PUT"},
		{"GET", "/api/read/x", "X-Original-URL", "/api/admin/delete-all"},
		{"POST", "/api/write/x", "X-Rewrite-Url", "/api/admin/delete-all"},
		{"GET", "/api/read/x", "X_HTTP_METHOD_OVERRIDE", "DELETE"},
	} {
		req, _ := http.NewRequest(tc.method, "https://api.internet.test"+tc.path, strings.NewReader("x"))
		req.Header[tc.header] = []string{tc.value}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(strings.ToLower(string(b)), "header "+strings.ToLower(tc.header)) {
			t.Errorf("%s %s with %s: %d %q; want 403 naming the header", tc.method, tc.path, tc.header, resp.StatusCode, b)
		}
	}
	select {
	case a := <-asks:
		t.Errorf("asked about %s %s", a.Method, a.URL)
	default:
	}
	if n := len(rc.Got()); n != 0 {
		t.Errorf("upstream got %d requests; want none", n)
	}
}

// A program that fills the approvals' record with requests refused at
// once cannot keep out of it a request let through, nor a decision a
// person took.
func TestServiceApprovalRecordedPastTheBound(t *testing.T) {
	approve := func(ctx context.Context, a approvals.Approval) approvals.Decision {
		switch {
		case strings.HasSuffix(a.URL, "/let-through"):
			return approvals.Decision{Approved: true, By: "operator (alice)", Taken: true}
		case strings.HasSuffix(a.URL, "/refused"):
			return approvals.Decision{By: "operator (bob)", Taken: true}
		}
		return approvals.Decision{By: "too many calls waiting"}
	}
	r, _ := newServiceRun(t, approve, 5*time.Second)
	r.px.unlimitHeldRate()
	c := r.serviceClient()
	post := func(p string) {
		resp, err := c.Post("https://api.internet.test/api/write/"+p, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for range maxDenied {
		post("flood")
	}
	post("let-through")
	post("refused")
	post("flood")
	var got []string
	for _, a := range r.px.Report().Approvals {
		if a.By != "too many calls waiting" {
			got = append(got, fmt.Sprintf("%s %v %s", a.URL, a.Approved, a.By))
		}
	}
	want := []string{"https://api.internet.test/api/write/let-through true operator (alice)", "https://api.internet.test/api/write/refused false operator (bob)"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("approvals recorded past the bound = %q; want %q", got, want)
	}
	if n := len(r.px.Report().Approvals); n != maxDenied+2 {
		t.Errorf("%d approvals recorded; want %d", n, maxDenied+2)
	}
}

// A "_method" parameter, in the query or in a form body, counts as the
// method a server acts on: refused unless a rule allows that method for
// the path too, and shown to the approver. A form body too long to be
// checked is refused.
func TestServiceMethodParam(t *testing.T) {
	asks := make(chan approvals.Approval, 8)
	r, rc := newServiceRun(t, func(ctx context.Context, a approvals.Approval) approvals.Decision {
		asks <- a
		return approvals.Decision{Approved: true, By: "test operator"}
	}, 5*time.Second)
	c := r.serviceClient()
	send := func(method, path, ctype, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "https://api.internet.test"+path, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const form = "application/x-www-form-urlencoded"
	for _, tc := range []struct{ method, path, ctype, body string }{
		{"GET", "/api/read/x?_method=DELETE", "", ""},
		{"GET", "/api/read/x?a=1&%5Fmethod=delete", "", ""},
		{"GET", "/api/read/x?_METHOD=Put", "", ""},
		{"GET", "/api/read/x?%255Fmethod=DELETE", "", ""},
		{"POST", "/api/write/x?_method=DELETE", "text/plain", "x"},
		{"POST", "/api/write/x", form, "a=1&_method=DELETE"},
		{"POST", "/api/write/x", "Application/X-WWW-Form-Urlencoded; charset=utf-8", "%5FMethod=PATCH"},
		{"POST", "/api/write/x", "", "_method=PUT"},
		{"POST", "/api/write/x", form, "_method=TRACE"},
	} {
		before := len(rc.Got())
		code, body := send(tc.method, tc.path, tc.ctype, tc.body)
		if code != 403 || !strings.Contains(body, "_method=") {
			t.Errorf("%s %s %q: %d %q; want 403 naming _method", tc.method, tc.path, tc.body, code, body)
		}
		if len(rc.Got()) != before {
			t.Errorf("%s %s %q: sent upstream", tc.method, tc.path, tc.body)
		}
		rep := r.px.Report()
		if got := rep.Requests[len(rep.Requests)-1]; got.Allowed || !strings.Contains(got.Reason, "_method=") {
			t.Errorf("%s %s %q recorded as %+v", tc.method, tc.path, tc.body, got)
		}
	}
	long := "a=" + strings.Repeat("x", MaxFormBytes) + "&_method=DELETE"
	if code, body := send("POST", "/api/write/x", form, long); code != 403 || !strings.Contains(body, "form body longer than") {
		t.Errorf("form body of %d bytes: %d %.200q; want 403", len(long), code, body)
	}
	select {
	case a := <-asks:
		t.Errorf("asked about %s %s", a.Method, a.URL)
	default:
	}
	if n := len(rc.Got()); n != 0 {
		t.Fatalf("upstream got %d requests; want none", n)
	}

	// A method the rules allow passes, its body whole; a _method outside
	// a form is not one.
	if code, body := send("POST", "/api/any/x", form, "_method=DELETE&b=2"); code != 200 || body != `api POST /api/any/x body="_method=DELETE&b=2"` {
		t.Errorf("_method a rule allows: %d %q; want 200 with the body sent whole", code, body)
	}
	if code, body := send("POST", "/api/write/x", "application/json", `{"_method":"DELETE"}`); code != 200 {
		t.Errorf("JSON body naming _method: %d %q; want 200", code, body)
	}
	if a := <-asks; a.Method != "POST" {
		t.Errorf("approval of a JSON body shows method %q; want POST", a.Method)
	}
	if code, body := send("POST", "/api/write/x?_method=post", "text/plain", "x"); code != 200 {
		t.Errorf("_method=post to a POST rule: %d %q; want 200", code, body)
	}
	if a := <-asks; a.Method != "POST (_method=POST)" {
		t.Errorf("approval shows method %q; want POST (_method=POST)", a.Method)
	}
}

// A held request whose client hangs up is withdrawn at once, on every
// path to the service (plain HTTP through the proxy or transparently,
// TLS through CONNECT or transparently), also with most of its body
// unread: the approver's context ends, an approval that comes after
// sends nothing, and the run's record says it was abandoned.
func TestServiceApprovalWithdrawnOnHangup(t *testing.T) {
	type ask struct {
		a     approvals.Approval
		ended <-chan struct{}
	}
	asks := make(chan ask, 1)
	answers := make(chan bool, 1)
	r, rc := newServiceRun(t, func(ctx context.Context, a approvals.Approval) approvals.Decision {
		asks <- ask{a, ctx.Done()}
		select {
		case ok := <-answers:
			return approvals.Decision{Approved: ok, By: "test operator", Taken: true}
		case <-ctx.Done():
			return approvals.Decision{}
		}
	}, time.Minute)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.px.CACert())
	// Past the excerpt and the proxy's first reads, and within what its
	// socket takes in: a client's FIN is queued behind the bytes it could not
	// send yet.
	body := strings.Repeat("b", 16<<10)
	dialGW := func(port string) net.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, port))
		if err != nil {
			t.Fatalf("dialing the gateway's :%s: %v", port, err)
		}
		return c
	}
	tlsTo := func(c net.Conn) net.Conn {
		return tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "api.internet.test"})
	}
	for _, tc := range []struct {
		name string
		open func() net.Conn
		line string
		host string
	}{
		{"plain http through the proxy", func() net.Conn { return dialGW("3128") },
			"POST http://plain.internet.test/api/write/x HTTP/1.1", "plain.internet.test"},
		{"plain http transparently", func() net.Conn { return dialGW("80") },
			"POST /api/write/x HTTP/1.1", "plain.internet.test"},
		{"tls through CONNECT", func() net.Conn {
			_, _, c := r.connect("api.internet.test:443")
			if c == nil {
				t.Fatal("CONNECT api.internet.test:443 refused")
			}
			c.SetDeadline(time.Time{})
			return tlsTo(c)
		}, "POST /api/write/x HTTP/1.1", "api.internet.test"},
		{"tls transparently", func() net.Conn { return tlsTo(dialGW("443")) },
			"POST /api/write/x HTTP/1.1", "api.internet.test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(rc.Got())
			c := tc.open()
			go fmt.Fprintf(c, "%s\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n%s", tc.line, tc.host, len(body), body)
			var got ask
			select {
			case got = <-asks:
			case <-time.After(10 * time.Second):
				c.Close()
				t.Fatal("the request was never held")
			}
			c.Close()
			select {
			case <-got.ended:
			case <-time.After(10 * time.Second):
				t.Errorf("approver still asked 10 s after the client hung up")
			}
			answers <- true // comes too late: nothing is sent
			// The request's record is the last written once it is done.
			recorded := func() bool {
				reqs := r.px.Report().Requests
				return len(reqs) > 0 && reqs[len(reqs)-1].Approval == got.a.ID
			}
			for deadline := time.Now().Add(10 * time.Second); !recorded() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if h := r.px.Held(); h != 0 || !recorded() {
				t.Fatalf("held = %d, request recorded %v after the client went; want 0, true", h, recorded())
			}
			select {
			case <-answers:
			default:
			}
			if n := len(rc.Got()); n != before {
				t.Errorf("upstream got %d requests after the client hung up; want none", n-before)
			}
			rep := r.px.Report()
			if last := rep.Approvals[len(rep.Approvals)-1]; last.ID != got.a.ID || last.Approved || last.By != "request abandoned" {
				t.Errorf("approval record = %+v; want abandoned", last)
			}
			if last := rep.Requests[len(rep.Requests)-1]; last.Approval != got.a.ID || last.Allowed || last.Reason != "request abandoned" {
				t.Errorf("request record = %+v; want abandoned", last)
			}
		})
	}
}

// unlimitHeldRate lifts the bound on how often p's run may hold requests
// (not the one on how many at once), for a test that floods the approver.
func (p *Proxy) unlimitHeldRate() {
	p.mu.Lock()
	p.heldRate = rate.NewLimiter(rate.Inf, 0)
	p.mu.Unlock()
}

// A run holds at most maxHeld requests at once, and past a burst of as
// many, one more each heldEvery: more are refused at once with 403 and a
// reason that says which bound, recorded, and never reach the approver.
func TestServiceHeldBounds(t *testing.T) {
	asks := make(chan approvals.Approval, 2*maxHeld)
	r, rc := newServiceRun(t, func(ctx context.Context, a approvals.Approval) approvals.Decision {
		asks <- a
		<-ctx.Done()
		return approvals.Decision{}
	}, time.Minute)
	c := r.serviceClient()
	post := func(path string) (int, string) {
		resp, err := c.Post("https://api.internet.test/api/write/"+path, "text/plain", strings.NewReader("x"))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	wantRefused := func(path, reason string) {
		t.Helper()
		code, body := post(path)
		if code != 403 || !strings.Contains(body, "denied: "+reason) {
			t.Errorf("POST %s: %d %q; want 403 saying %q", path, code, body, reason)
		}
		rep := r.px.Report()
		if got := rep.Requests[len(rep.Requests)-1]; got.Allowed || got.Reason != reason || !strings.HasSuffix(got.Path, path) {
			t.Errorf("POST %s recorded as %+v; want refused: %s", path, got, reason)
		}
		if got := rep.Approvals[len(rep.Approvals)-1]; got.By != reason || !strings.HasSuffix(got.URL, path) {
			t.Errorf("POST %s's approval recorded as %+v; want by %q", path, got, reason)
		}
	}
	// With maxHeld held, one more is refused; those held stay held.
	done := make(chan struct{}, maxHeld)
	for i := range maxHeld {
		go func() { post(fmt.Sprintf("held-%d", i)); done <- struct{}{} }()
	}
	for range maxHeld {
		select {
		case <-asks:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d requests held; want %d", r.px.Held(), maxHeld)
		}
	}
	wantRefused("one-too-many", reasonTooManyApp)
	select {
	case a := <-asks:
		t.Errorf("asked about %s past the bound", a.URL)
	default:
	}
	if h := r.px.Held(); h != maxHeld {
		t.Errorf("held = %d; want %d", h, maxHeld)
	}
	if n := len(rc.Got()); n != 0 {
		t.Errorf("upstream got %d requests; want none", n)
	}
	r.px.Close() // ends the held ones
	for range maxHeld {
		<-done
	}

	// How often: a limiter of two, then one an hour.
	r2, rc2 := newServiceRun(t, func(ctx context.Context, a approvals.Approval) approvals.Decision {
		return approvals.Decision{By: "test operator", Taken: true}
	}, time.Minute)
	r2.px.mu.Lock()
	r2.px.heldRate = rate.NewLimiter(rate.Every(time.Hour), 2)
	r2.px.mu.Unlock()
	r = r2
	c = r.serviceClient()
	for _, p := range []string{"first", "second"} {
		if code, body := post(p); code != 403 || body != "agentrun: denied by the operator" {
			t.Errorf("POST %s: %d %q; want asked and denied by the operator", p, code, body)
		}
	}
	wantRefused("third", reasonTooOftenApp)
	if n := len(rc2.Got()); n != 0 {
		t.Errorf("upstream got %d requests; want none", n)
	}
}
