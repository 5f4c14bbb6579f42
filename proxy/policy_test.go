package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

func TestNewProxyRejectsBadPolicy(t *testing.T) {
	gw := netip.MustParseAddr("10.200.0.1")
	for _, p := range []Policy{
		{Hosts: map[string]netip.Addr{"pypi.org": {}}},
		{Hosts: map[string]netip.Addr{"bad host": netip.MustParseAddr("1.2.3.4")}},
		{MaxBytes: -1},
		{MaxConns: -1},
		{HostPorts: []netip.AddrPort{{}}},
		{HostPorts: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)}},
	} {
		if _, err := newProxy(gw, p); err == nil {
			t.Errorf("newProxy(%+v) = nil error; want an error", p)
		}
	}
	px, err := newProxy(gw, Policy{Allow: allowOf("pypi.org"), Hosts: map[string]netip.Addr{"PyPI.org.": netip.MustParseAddr("::ffff:1.2.3.4")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := px.hosts["pypi.org"]; got != netip.MustParseAddr("1.2.3.4") {
		t.Errorf("hosts[pypi.org] = %v; want 1.2.3.4", got)
	}
	if got := string(px.ResolvConf()); got != "nameserver 10.200.0.1\noptions ndots:0 timeout:2 attempts:2\n" {
		t.Errorf("ResolvConf() = %q", got)
	}
	if px.Env()["HTTP_PROXY"] != "http://10.200.0.1:3128" {
		t.Errorf("Env() = %v", px.Env())
	}
	if err := px.Close(); err != nil { // never started: still fine
		t.Error(err)
	}
}

// newProxy checks the policy and builds a bound proxy with no listeners.
func newProxy(gw netip.Addr, p Policy) (*Proxy, error) {
	px := unbound(gw)
	px.bindTried = true
	if err := px.setPolicy(p); err != nil {
		return nil, err
	}
	px.bound.Store(true)
	return px, nil
}

// The host's own addresses (Policy.Own, asked at each dial) are refused
// as a denial whatever the ranges, unless HostPorts lists the exact
// address and port; a service's upstream, which the operator named, is
// dialled whatever Own says.
func TestProxyRefusesHostOwn(t *testing.T) {
	self := netip.MustParseAddr("203.0.113.9")
	var mu sync.Mutex
	owned := map[netip.Addr]bool{self: true}
	var dialled []string
	pol := Policy{
		Allow:       allowOf("self.test:8080", "self.test:4222", "moved.test"),
		Hosts:       map[string]netip.Addr{"self.test": self, "moved.test": netip.MustParseAddr("203.0.113.10")},
		AllowRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
		HostPorts:   []netip.AddrPort{netip.AddrPortFrom(self, 4222)},
		Own: func(a netip.Addr) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if a == netip.MustParseAddr("203.0.113.11") {
				return false, errors.New("no routes")
			}
			return owned[a], nil
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialled = append(dialled, addr)
			mu.Unlock()
			a, b := net.Pipe()
			b.Close()
			return a, nil
		},
	}
	px, err := newProxy(netip.MustParseAddr("10.200.0.1"), pol)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	refused := func(host string, port int, want string) {
		t.Helper()
		c, err := px.connect(target{host, port})
		var d *denial
		if !errors.As(err, &d) || !strings.Contains(d.reason, want) {
			if c != nil {
				c.Close()
			}
			t.Errorf("connect(%s:%d) = %v; want a denial %q", host, port, err, want)
		}
	}
	allowed := func(connect func(target) (net.Conn, error), host string, port int, addr string) {
		t.Helper()
		mu.Lock()
		dialled = nil
		mu.Unlock()
		c, err := connect(target{host, port})
		if err != nil {
			t.Errorf("connect(%s:%d) = %v; want dialled", host, port, err)
			return
		}
		c.Close()
		mu.Lock()
		defer mu.Unlock()
		if len(dialled) != 1 || dialled[0] != addr {
			t.Errorf("connect(%s:%d) dialled %v; want [%s]", host, port, dialled, addr)
		}
	}
	refused("self.test", 8080, netpolicy.ReasonHostOwn+" 203.0.113.9 (network.host_ports does not list 203.0.113.9:8080)")
	allowed(px.connect, "self.test", 4222, "203.0.113.9:4222")
	allowed(px.connect, "moved.test", 443, "203.0.113.10:443")
	allowed(px.connectService, "self.test", 8080, "203.0.113.9:8080")

	// Own is asked when the dial happens: an address that becomes the
	// host's is refused from then on, one that stops being it passes.
	mu.Lock()
	owned[netip.MustParseAddr("203.0.113.10")], owned[self] = true, false
	mu.Unlock()
	refused("moved.test", 443, netpolicy.ReasonHostOwn+" 203.0.113.10")
	allowed(px.connect, "self.test", 8080, "203.0.113.9:8080")

	// An unknown answer refuses.
	px.hosts["moved.test"] = netip.MustParseAddr("203.0.113.11")
	refused("moved.test", 443, netpolicy.ReasonHostOwn+" unknown")
	mu.Lock()
	defer mu.Unlock()
	if len(dialled) != 1 {
		t.Errorf("refusals dialled %v", dialled)
	}
}

// allowOf parses a test's allowlist entries; it panics on a bad one.
func allowOf(entries ...string) *netpolicy.Allowlist {
	a, err := netpolicy.ParseAllow(entries)
	if err != nil {
		panic(err)
	}
	return a
}

// withAllow is a with more entries.
func withAllow(a *netpolicy.Allowlist, more ...string) *netpolicy.Allowlist {
	return allowOf(append(a.Entries(), more...)...)
}

// validated validates a test's services; it panics on a bad one.
func validated(ss []netpolicy.Service) []*netpolicy.Service {
	out := make([]*netpolicy.Service, len(ss))
	for i := range ss {
		if err := ss[i].Validate(); err != nil {
			panic(err)
		}
		out[i] = &ss[i]
	}
	return out
}

// Bind takes what is parsed and validated already, and refuses services
// that are not validated or that share a host and port; it never changes
// the allowlist it is given.
func TestBindChecksServices(t *testing.T) {
	gw := netip.MustParseAddr("10.200.0.1")
	rules := []netpolicy.Rule{{Methods: []string{"GET"}, Paths: []string{"/**"}}}
	a := netpolicy.Service{Name: "a", URL: "https://api.example.com", Rules: rules}
	b := netpolicy.Service{Name: "b", URL: "https://API.example.com:443/", Rules: rules}
	for _, tc := range []struct {
		services []*netpolicy.Service
		want     string
	}{
		{[]*netpolicy.Service{&a}, "starting proxy: services[0] is not validated"},
		{[]*netpolicy.Service{nil}, "starting proxy: services[0] is not validated"},
		{validated([]netpolicy.Service{a, b}), `starting proxy: services "a" and "b" are both at api.example.com:443`},
	} {
		if _, err := newProxy(gw, Policy{Services: tc.services}); err == nil || err.Error() != tc.want {
			t.Errorf("newProxy(services %v) = %v; want %q", tc.services, err, tc.want)
		}
	}
	allow := allowOf("pypi.org")
	px, err := newProxy(gw, Policy{Allow: allow, Services: validated([]netpolicy.Service{a})})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	if !px.allow.Match("api.example.com", 443) || !px.allow.Match("pypi.org", 443) {
		t.Error("the proxy's allowlist lacks the service or the policy's entry")
	}
	if allow.Match("api.example.com", 443) {
		t.Error("Bind added the service to the policy's allowlist")
	}
}
