//go:build linux

package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy/proxytest"

	"github.com/agentrun/agentrun/test/testenv"
)

// Tests here need root: they build namespaces and veths.

// run is one sandbox network with a proxy, seen from the sandbox.
type run struct {
	t   *testing.T
	n   *netns.Net
	px  *Proxy
	gw  string
	in  *proxytest.Internet
	trs []*http.Transport
}

var subnets = func() *netns.Subnets {
	p, err := netns.NewSubnets(netns.DefaultCIDR)
	if err != nil {
		panic(err)
	}
	return p
}()

func policyFor(in *proxytest.Internet) Policy {
	return Policy{
		Allow: allowOf("internet.test", "*.internet.test", "loop.test", "private.test", "metadata.test", "rebind.test", "mapped.test"),
		Hosts: map[string]netip.Addr{
			"internet.test":     in.IP,
			"www.internet.test": in.IP,
			"big.internet.test": in.IP,
			"loop.test":         netip.MustParseAddr("127.0.0.1"),
			"private.test":      netip.MustParseAddr("10.0.0.1"),
			"metadata.test":     netip.MustParseAddr("169.254.169.254"),
			"mapped.test":       netip.MustParseAddr("::ffff:127.0.0.1"),
		},
		AllowRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		Resolver: func(ctx context.Context, host string) ([]netip.Addr, error) {
			if host == "rebind.test" {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("169.254.1.1")}, nil
			}
			return nil, fmt.Errorf("no such host %s (test resolver)", host)
		},
	}
}

func startRun(t *testing.T, in *proxytest.Internet, p Policy) *run {
	t.Helper()
	n, err := subnets.Setup()
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	px, err := Start(n, p)
	if err != nil {
		n.Close()
		t.Fatalf("Start: %v", err)
	}
	r := &run{t: t, n: n, px: px, gw: n.Gateway.String(), in: in}
	t.Cleanup(r.close)
	return r
}

func (r *run) close() {
	for _, tr := range r.trs {
		tr.CloseIdleConnections()
	}
	if err := r.px.Close(); err != nil {
		r.t.Errorf("proxy Close: %v", err)
	}
	if err := r.n.Close(); err != nil {
		r.t.Errorf("net Close: %v", err)
	}
}

// dial connects from the sandbox to an IP literal address.
func (r *run) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return r.n.DialContext(ctx, netns.Sandbox, network, addr)
}

// explicitClient uses HTTP_PROXY as a program in the sandbox would.
func (r *run) explicitClient() *http.Client {
	u, err := url.Parse(r.px.Env()["HTTPS_PROXY"])
	if err != nil {
		r.t.Fatal(err)
	}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(u),
		DialContext:       r.dial,
		TLSClientConfig:   &tls.Config{RootCAs: r.in.Roots},
		DisableKeepAlives: true,
	}
	r.trs = append(r.trs, tr)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// lookup asks the gateway's DNS from the sandbox.
func (r *run) lookup(network, name string, qtype uint16) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.dial(ctx, network, net.JoinHostPort(r.gw, "53"))
	if err != nil {
		return nil, err
	}
	co := &dns.Conn{Conn: c}
	defer co.Close()
	co.SetDeadline(time.Now().Add(5 * time.Second))
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

// transparentClient resolves through the gateway's DNS and connects to the
// answer directly, as a program that ignores proxy variables would.
func (r *run) transparentClient() *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			m, err := r.lookup("udp4", host, dns.TypeA)
			if err != nil {
				return nil, err
			}
			if m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 {
				return nil, fmt.Errorf("lookup %s: %s", host, dns.RcodeToString[m.Rcode])
			}
			return r.dial(ctx, "tcp4", net.JoinHostPort(m.Answer[0].(*dns.A).A.String(), port))
		},
		TLSClientConfig:   &tls.Config{RootCAs: r.in.Roots},
		DisableKeepAlives: true,
	}
	r.trs = append(r.trs, tr)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", u, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// connect sends a raw CONNECT to the proxy and returns its answer.
func (r *run) connect(authority string) (*http.Response, string, net.Conn) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, "3128"))
	if err != nil {
		r.t.Fatalf("dialing proxy: %v", err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		r.t.Fatalf("CONNECT %s: %v", authority, err)
	}
	var body string
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		c.Close()
		return resp, body, nil
	}
	return resp, body, c
}

func (r *run) wantDenied(host string, port int, reason string) {
	r.t.Helper()
	for _, d := range r.px.Report().Denied {
		if d.Host == host && d.Port == port && strings.Contains(d.Reason, reason) {
			return
		}
	}
	r.t.Errorf("report has no denial %s:%d %q; report: %+v", host, port, reason, r.px.Report().Denied)
}

func TestProxyEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	testenv.NoLeaks(t)
	r := startRun(t, in, policyFor(in))

	t.Run("explicit https", func(t *testing.T) {
		code, body, _ := get(t, r.explicitClient(), "https://internet.test/hello")
		if code != 200 || body != "hello from internet.test over https" {
			t.Errorf("got %d %q", code, body)
		}
	})
	t.Run("explicit http", func(t *testing.T) {
		code, body, _ := get(t, r.explicitClient(), "http://www.internet.test/hello")
		if code != 200 || body != "hello from www.internet.test over http" {
			t.Errorf("got %d %q", code, body)
		}
	})
	t.Run("explicit http post body", func(t *testing.T) {
		resp, err := r.explicitClient().Post("http://internet.test/echo", "text/plain", strings.NewReader("ping body"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ping body" {
			t.Errorf("got %d %q", resp.StatusCode, b)
		}
	})
	t.Run("transparent https", func(t *testing.T) {
		code, body, _ := get(t, r.transparentClient(), "https://www.internet.test/hello")
		if code != 200 || body != "hello from www.internet.test over https" {
			t.Errorf("got %d %q", code, body)
		}
	})
	t.Run("transparent http", func(t *testing.T) {
		code, body, _ := get(t, r.transparentClient(), "http://internet.test/hello")
		if code != 200 || body != "hello from internet.test over http" {
			t.Errorf("got %d %q", code, body)
		}
	})
	t.Run("dns", func(t *testing.T) {
		for _, network := range []string{"udp4", "tcp4"} {
			m, err := r.lookup(network, "Internet.Test", dns.TypeA)
			if err != nil {
				t.Fatalf("%s: %v", network, err)
			}
			if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != r.gw {
				t.Errorf("%s A internet.test = %v; want %s", network, m, r.gw)
			}
			m, err = r.lookup(network, "x.internet.test", dns.TypeAAAA)
			if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
				t.Errorf("%s AAAA x.internet.test = %v, %v; want empty NOERROR", network, m, err)
			}
			m, err = r.lookup(network, "evil.example", dns.TypeA)
			if err != nil || m.Rcode != dns.RcodeNameError || len(m.Answer) != 0 {
				t.Errorf("%s A evil.example = %v, %v; want NXDOMAIN", network, m, err)
			}
			m, err = r.lookup(network, "internet.test.evil.example", dns.TypeTXT)
			if err != nil || m.Rcode != dns.RcodeNameError {
				t.Errorf("%s TXT lookalike = %v, %v; want NXDOMAIN", network, m, err)
			}
		}
		r.wantDenied("evil.example", 53, "not in allowlist (dns)")
		r.wantDenied("internet.test.evil.example", 53, "not in allowlist (dns)")
	})
	t.Run("denied name", func(t *testing.T) {
		resp, body, _ := r.connect("evil.example:443")
		want := "agentrun: egress to evil.example:443 denied: not in allowlist"
		if resp.StatusCode != 403 || strings.TrimSpace(body) != want || resp.Header.Get("X-Agentrun-Denied") != want {
			t.Errorf("CONNECT evil.example:443 = %d %q (header %q); want 403 %q", resp.StatusCode, body, resp.Header.Get("X-Agentrun-Denied"), want)
		}
		code, body, _ := get(t, r.explicitClient(), "http://evil.example/")
		if code != 403 || !strings.Contains(body, "denied: not in allowlist") {
			t.Errorf("GET http://evil.example/ = %d %q; want 403", code, body)
		}
		for _, auth := range []string{"internet.test:22", "internet.test.evil.example:443", "evilinternet.test:443", "internet.test..:443"} {
			if resp, body, _ := r.connect(auth); resp.StatusCode != 403 {
				t.Errorf("CONNECT %s = %d %q; want 403", auth, resp.StatusCode, body)
			}
		}
		r.wantDenied("evil.example", 443, "not in allowlist")
		r.wantDenied("evil.example", 80, "not in allowlist")
		r.wantDenied("internet.test", 22, "not in allowlist")
	})
	t.Run("ip literals", func(t *testing.T) {
		ipv4 := in.IP.As4()
		dec := uint32(ipv4[0])<<24 | uint32(ipv4[1])<<16 | uint32(ipv4[2])<<8 | uint32(ipv4[3])
		for _, auth := range []string{
			in.IP.String() + ":443",
			fmt.Sprintf("%d:443", dec),
			fmt.Sprintf("0x%08x:443", dec),
			"[::ffff:" + in.IP.String() + "]:443",
			"169.254.169.254:80",
		} {
			resp, body, _ := r.connect(auth)
			if resp.StatusCode != 403 || !strings.Contains(body, "ip literals are not allowed") {
				t.Errorf("CONNECT %s = %d %q; want 403 ip literals", auth, resp.StatusCode, body)
			}
		}
		code, body, _ := get(t, r.explicitClient(), "http://"+in.IP.String()+"/hello")
		if code != 403 || !strings.Contains(body, "ip literals are not allowed") {
			t.Errorf("GET by IP = %d %q; want 403", code, body)
		}
		if resp, body, _ := r.connect("user:pw@internet.test:443"); resp.StatusCode != 403 || !strings.Contains(body, "userinfo") {
			t.Errorf("CONNECT with userinfo = %d %q; want 403", resp.StatusCode, body)
		}
	})
	t.Run("non-global addresses", func(t *testing.T) {
		for name, want := range map[string]string{
			"private.test": "address 10.0.0.1 is not globally routable", "metadata.test": "address 169.254.169.254 is not globally routable",
			// Loopback is the host's own before it is a range.
			"loop.test": "host's own address 127.0.0.1", "mapped.test": "host's own address 127.0.0.1", "rebind.test": "host's own address 127.0.0.1",
		} {
			resp, body, _ := r.connect(name + ":443")
			if resp.StatusCode != 403 || !strings.Contains(body, want) {
				t.Errorf("CONNECT %s:443 = %d %q; want 403 %q", name, resp.StatusCode, body, want)
			}
			r.wantDenied(name, 443, want)
		}
	})
	t.Run("transparent denied", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, "443"))
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "evil.example", RootCAs: in.Roots})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("TLS to gw:443 with SNI evil.example: %v; want access denied", err)
		}
		tc.Close()
		c, err = r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, "80"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 403 {
			t.Errorf("HTTP to gw:80 with Host evil.example = %v, %v; want 403", resp, err)
		}
		c.Close()
		r.wantDenied("evil.example", 443, "not in allowlist")
	})
	t.Run("no direct egress", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if c, err := r.dial(ctx, "tcp4", net.JoinHostPort(in.IP.String(), "80")); err == nil {
			c.Close()
			t.Error("sandbox connected to the internet host directly")
		}
		// UDP: the echo answers the host (control), never the sandbox.
		if err := udpEcho(func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "udp4", netip.AddrPortFrom(in.IP, 9999).String())
		}); err != nil {
			t.Fatalf("control: host UDP echo: %v", err)
		}
		if err := udpEcho(func(ctx context.Context) (net.Conn, error) {
			return r.dial(ctx, "udp4", netip.AddrPortFrom(in.IP, 9999).String())
		}); err == nil {
			t.Error("sandbox got a UDP answer from the internet host")
		}
		// A host service on 0.0.0.0 is out of reach.
		l, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
		for _, ip := range []string{r.gw, in.HostIP.String(), "127.0.0.1"} {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			c, err := r.dial(ctx, "tcp4", net.JoinHostPort(ip, port))
			cancel()
			if err == nil {
				c.Close()
				t.Errorf("sandbox reached host listener via %s:%s", ip, port)
			}
		}
	})
	t.Run("report", func(t *testing.T) {
		var found bool
		for _, a := range r.px.Report().Allowed {
			if a.Host == "internet.test" && a.Port == 443 {
				found = a.BytesIn > 0 && a.BytesOut > 0 && a.Conns >= 1
			}
		}
		if !found {
			t.Errorf("report lacks traffic to internet.test:443: %+v", r.px.Report().Allowed)
		}
	})
	t.Run("env and files", func(t *testing.T) {
		env := r.px.Env()
		want := "http://" + r.gw + ":3128"
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
			if env[k] != want {
				t.Errorf("Env()[%s] = %q; want %q", k, env[k], want)
			}
		}
		if v, ok := env["NO_PROXY"]; !ok || v != "" {
			t.Errorf("Env()[NO_PROXY] = %q, %v; want empty", v, ok)
		}
		if got := string(r.px.ResolvConf()); !strings.HasPrefix(got, "nameserver "+r.gw+"\n") || strings.Count(got, "nameserver") != 1 {
			t.Errorf("ResolvConf() = %q", got)
		}
		if got := string(r.px.Hosts()); !strings.Contains(got, "127.0.0.1\tlocalhost") {
			t.Errorf("Hosts() = %q", got)
		}
	})

	r.close()
	r.close() // idempotent
}

func udpEcho(dial func(ctx context.Context) (net.Conn, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(700 * time.Millisecond))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 16)
	n, err := c.Read(b)
	if err != nil {
		return err
	}
	if string(b[:n]) != "ping" {
		return fmt.Errorf("echo = %q", b[:n])
	}
	return nil
}

func TestProxyByteLimit(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	p := policyFor(in)
	p.MaxBytes = 64 << 10
	r := startRun(t, in, p)
	resp, err := r.explicitClient().Get("https://big.internet.test/big")
	if err == nil {
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n >= 256<<10 {
			t.Errorf("read %d bytes through a %d byte limit", n, p.MaxBytes)
		}
	}
	var in64 int64
	for _, a := range r.px.Report().Allowed {
		in64 += a.BytesIn
	}
	if in64 > p.MaxBytes || in64 == 0 {
		t.Errorf("BytesIn = %d; want 1..%d", in64, p.MaxBytes)
	}
	r.wantDenied("big.internet.test", 443, "byte limit exceeded")
	// The budget is spent for the rest of the run.
	if resp, body, _ := r.connect("internet.test:443"); resp.StatusCode != 403 || !strings.Contains(body, "byte limit") {
		t.Errorf("CONNECT after the limit = %d %q; want 403 byte limit", resp.StatusCode, body)
	}
}

func TestProxyMaxConns(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	p := policyFor(in)
	p.MaxConns = 1
	r := startRun(t, in, p)
	resp, _, c := r.connect("internet.test:443")
	if resp.StatusCode != 200 {
		t.Fatalf("first CONNECT = %d", resp.StatusCode)
	}
	resp2, body, _ := r.connect("internet.test:443")
	if resp2.StatusCode != 503 || !strings.Contains(body, "too many connections") {
		t.Errorf("second CONNECT = %d %q; want 503 too many connections", resp2.StatusCode, body)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp3, _, c3 := r.connect("internet.test:443")
		if resp3.StatusCode == 200 {
			c3.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CONNECT after closing the first = %d; want 200", resp3.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestProxyCloseCutsConnections closes the proxy under open tunnels and
// requests and checks that nothing is left.
func TestProxyCloseCutsConnections(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	testenv.NoLeaks(t)
	n, err := subnets.Setup()
	if err != nil {
		t.Fatal(err)
	}
	px, err := Start(n, policyFor(in))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{t: t, n: n, px: px, gw: n.Gateway.String(), in: in}
	var conns []net.Conn
	for range 3 {
		if _, _, c := r.connect("internet.test:443"); c != nil {
			conns = append(conns, c)
		}
	}
	// Half-sent request heads and idle connections to every listener.
	for _, port := range []string{"3128", "80", "443", "53"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, port))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET / HT"))
		conns = append(conns, c)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { io.Copy(io.Discard, c) })
	}
	start := time.Now()
	if err := px.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v", d)
	}
	wg.Wait() // every client saw its connection end
	for _, c := range conns {
		c.Close()
	}
	if err := n.Close(); err != nil {
		t.Error(err)
	}
}

// TestProxyUpstreamFailures reaches for allowed destinations that fail: a
// port where nothing listens, an address where nothing answers and a name
// that does not resolve. Each gets a 502 that says why (in the status line
// too) and lands in the report's failures.
func TestProxyUpstreamFailures(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	p := policyFor(in)
	p.Allow = withAllow(p.Allow, "internet.test:81", "silent.test", "nosuch.test")
	p.Hosts["silent.test"] = in.Silent
	resolve := p.Resolver
	p.Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host == "nosuch.test" {
			return nil, &net.DNSError{Err: "no such host", Name: host, Server: "192.0.2.53:53", IsNotFound: true}
		}
		return resolve(ctx, host)
	}
	r := startRun(t, in, p)

	for _, tc := range []struct{ authority, reason string }{
		{"internet.test:81", "connection refused"},
		{"silent.test:443", "host unreachable"},
		{"nosuch.test:443", "name does not resolve"},
	} {
		resp, body, _ := r.connect(tc.authority)
		want := "agentrun: egress to " + tc.authority + " failed: " + tc.reason
		if resp.StatusCode != 502 || !strings.HasPrefix(body, want) || resp.Status != "502 Bad Gateway: "+tc.reason {
			t.Errorf("CONNECT %s = %q %q; want 502 %q", tc.authority, resp.Status, body, want)
		}
		if strings.Contains(body, "192.0.2.53") {
			t.Errorf("CONNECT %s: body names the host's resolver: %q", tc.authority, body)
		}
	}
	code, body, hdr := get(t, r.explicitClient(), "http://nosuch.test/")
	if code != 502 || !strings.Contains(body, "nosuch.test:80 failed: name does not resolve") || hdr.Get("X-Agentrun-Error") == "" {
		t.Errorf("GET http://nosuch.test/ = %d %q; want 502 name does not resolve", code, body)
	}
	// Transparent: a TLS client gets an alert, and the failure is recorded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, "443"))
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "nosuch.test", RootCAs: in.Roots})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Error("TLS handshake through a failed upstream succeeded")
	}
	tc.Close()

	want := map[string]int{
		"internet.test:81 connection refused":   1,
		"silent.test:443 host unreachable":      1,
		"nosuch.test:443 name does not resolve": 2,
		"nosuch.test:80 name does not resolve":  1,
	}
	got := map[string]int{}
	for _, f := range r.px.Report().Failed {
		got[fmt.Sprintf("%s:%d %s", f.Host, f.Port, f.Reason)] = f.Count
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("report failure %q count = %d; want %d (report %+v)", k, got[k], n, r.px.Report().Failed)
		}
	}
	if d := r.px.Report().Denied; len(d) != 0 {
		t.Errorf("failures recorded as denials: %+v", d)
	}
}

// clientConnBytes bounds what agentrun holds for one client connection
// (docs/services.md): its head buffer (bufSize), the copy buffer of a
// tunnel, the stacks of its two goroutines and the kernel's socket buffers
// in the gateway namespace are well under it; netns caps the last.
const clientConnBytes = 4 * bufSize

// TestProxyClientFlood opens far more connections to the gateway's
// listeners than a run may hold, each with an unfinished 30 KB request head
// (or DNS message), and checks that the proxy holds at most MaxClients of
// them and stays under its stated memory ceiling, records the refusals,
// and serves a normal request once the flood ends.
func TestProxyClientFlood(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	p := policyFor(in)
	p.MaxConns = 32
	r := startRun(t, in, p)
	const flood = 1500

	head := []byte("GET http://internet.test/hello HTTP/1.1\r\nHost: internet.test\r\n")
	for len(head) < 30<<10 {
		head = append(head, "X-A: b\r\n"...)
	}
	dnsHead := append([]byte{0xff, 0xff}, make([]byte, 30<<10)...)

	memInUse := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	before := memInUse()

	var wg sync.WaitGroup
	conns := make([]net.Conn, 0, flood)
	ports := []string{"3128", "80", "443", "53"}
	for i := range flood {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, ports[i%len(ports)]))
		cancel()
		if errors.Is(err, syscall.ECONNRESET) {
			continue // over the cap, reset before connect returned
		}
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		data := head
		if ports[i%len(ports)] == "53" {
			data = dnsHead
		} else if ports[i%len(ports)] == "443" {
			data = append([]byte{22, 3, 1, 0x3f, 0xff, 1, 0, 0x3f, 0xfb}, make([]byte, 16000)...) // an unfinished ClientHello
		}
		wg.Go(func() {
			c.SetWriteDeadline(time.Now().Add(3 * time.Second))
			c.Write(data) // over the cap: reset, an error here
		})
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // the proxy reads what was sent
	held := memInUse() - min(before, memInUse())

	r.px.mu.Lock()
	clients := r.px.clients
	r.px.mu.Unlock()
	if clients > p.MaxClients() {
		t.Errorf("proxy holds %d client connections; want at most %d", clients, p.MaxClients())
	}
	// The flood's own client sockets live in this process too: 2 KiB each.
	ceiling := uint64(p.MaxClients()*clientConnBytes + flood*2<<10)
	t.Logf("%d connections: %d held by the proxy, %d KiB in use (ceiling %d KiB)", flood, clients, held>>10, ceiling>>10)
	if held > ceiling {
		t.Errorf("memory in use grew by %d KiB under the flood; ceiling %d KiB", held>>10, ceiling>>10)
	}
	r.wantDenied("", 3128, reasonTooManyClients)

	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.px.mu.Lock()
		clients = r.px.clients
		r.px.mu.Unlock()
		if clients == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d client connections still counted after the flood ended", clients)
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, body, _ := get(t, r.explicitClient(), "https://internet.test/hello")
	if code != 200 || body != "hello from internet.test over https" {
		t.Errorf("after the flood: got %d %q", code, body)
	}
	if m, err := r.lookup("tcp4", "internet.test", dns.TypeA); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Errorf("dns over tcp after the flood: %v, %v", m, err)
	}
}
