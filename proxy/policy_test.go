package proxy

import (
	"net/netip"
	"testing"
)

func TestNewProxyRejectsBadPolicy(t *testing.T) {
	gw := netip.MustParseAddr("10.200.0.1")
	for _, p := range []Policy{
		{Allow: []string{"*"}},
		{Allow: []string{"1.2.3.4"}},
		{Hosts: map[string]netip.Addr{"pypi.org": {}}},
		{Hosts: map[string]netip.Addr{"bad host": netip.MustParseAddr("1.2.3.4")}},
		{MaxBytes: -1},
		{MaxConns: -1},
	} {
		if _, err := newProxy(gw, p); err == nil {
			t.Errorf("newProxy(%+v) = nil error; want an error", p)
		}
	}
	px, err := newProxy(gw, Policy{Allow: []string{"pypi.org"}, Hosts: map[string]netip.Addr{"PyPI.org.": netip.MustParseAddr("::ffff:1.2.3.4")}})
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
