package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	a, err := ParseAllow([]string{"pypi.org", "*.pythonhosted.org", "API.Example.com:8443", "trailing.example.", "*.deep.example:443"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		host string
		port int
		want bool
	}{
		{"pypi.org", 443, true},
		{"pypi.org", 80, true},
		{"pypi.org", 8080, false},
		{"PyPI.ORG", 443, true},
		{"pypi.org.", 443, true},     // one trailing dot dropped
		{"pypi.org..", 443, false},   // only one
		{"www.pypi.org", 443, false}, // exact means exact
		{"pypi.org.evil.com", 443, false},
		{"evilpypi.org", 443, false},
		{"pypi.org\x00.evil.com", 443, false},
		{"pypi.org:443", 443, false},
		{"files.pythonhosted.org", 443, true},
		{"a.b.files.pythonhosted.org", 80, true},
		{"pythonhosted.org", 443, false}, // wildcard excludes the suffix itself
		{"evilpythonhosted.org", 443, false},
		{"files.pythonhosted.org.evil.com", 443, false},
		{"api.example.com", 8443, true},
		{"api.example.com", 443, false},
		{"API.EXAMPLE.COM.", 8443, true},
		{"trailing.example", 80, true},
		{"x.deep.example", 443, true},
		{"x.deep.example", 80, false},
		{"", 443, false},
		{".", 443, false},
		{"127.0.0.1", 80, false},
		{"[::1]", 80, false},
		{"3232235777", 80, false},
		{"0xc0a80101", 80, false},
		{"pypi.org\u212a", 443, false}, // Kelvin sign does not fold to k
	}
	for _, tt := range tests {
		if got := a.Match(tt.host, tt.port); got != tt.want {
			t.Errorf("Match(%q, %d) = %v; want %v", tt.host, tt.port, got, tt.want)
		}
	}
	if got, want := a.Ports(), []int{80, 443, 8443}; !slices.Equal(got, want) {
		t.Errorf("Ports() = %v; want %v", got, want)
	}
	if !a.MatchName("API.example.com.") || a.MatchName("example.com") || !a.MatchName("x.pythonhosted.org") {
		t.Error("MatchName disagrees with the entries")
	}
}

func TestMatchIPEntriesNeverMatchNames(t *testing.T) {
	// Even a name made only of digits and dots cannot be allowlisted.
	for _, e := range []string{"1.2.3.4", "1.2.3.4:443", "[::1]:443", "::1", "3232235777", "0x7f000001", "127.1", "*", "*.com", "a.*.com", "foo*.com", "bad_host!.com", "pypi.org:0", "pypi.org:65536", "pypi.org:+80", "pypi.org:", ""} {
		if _, err := ParseAllow([]string{e}); err == nil {
			t.Errorf("ParseAllow(%q) = nil error; want an error", e)
		}
	}
	var empty Allowlist
	if empty.Match("pypi.org", 443) {
		t.Error("empty allowlist matched")
	}
}

func TestParseAllowRefusesURLs(t *testing.T) {
	for _, e := range []string{"https://pypi.org", "http://pypi.org:8080/", "pypi.org/simple"} {
		_, err := ParseAllow([]string{e})
		if err == nil || !strings.Contains(err.Error(), "a URL, not a host name") {
			t.Errorf("ParseAllow(%q) = %v; want a URL error", e, err)
		}
	}
}

func TestIsIPLiteral(t *testing.T) {
	for _, h := range []string{"127.0.0.1", "3232235777", "0xc0a80101", "0XC0A80101", "0300.0250.1.1", "127.1", "::1", "::ffff:127.0.0.1", "[::1]", "fe80::1%eth0", "1.2.3.4."} {
		if !isIPLiteral(h) {
			t.Errorf("isIPLiteral(%q) = false; want true", h)
		}
	}
	for _, h := range []string{"pypi.org", "1e100.net", "0x.example.com", "123.example", "localhost"} {
		if isIPLiteral(h) {
			t.Errorf("isIPLiteral(%q) = true; want false", h)
		}
	}
}

func TestNewProxyRejectsBadPolicy(t *testing.T) {
	gw := netip.MustParseAddr("10.200.0.1")
	for _, p := range []Policy{
		{Allow: []string{"*"}},
		{Allow: []string{"1.2.3.4"}},
		{Hosts: map[string]string{"pypi.org": "not-an-ip"}},
		{Hosts: map[string]string{"bad host": "1.2.3.4"}},
		{MaxBytes: -1},
		{MaxConns: -1},
	} {
		if _, err := newProxy(gw, p); err == nil {
			t.Errorf("newProxy(%+v) = nil error; want an error", p)
		}
	}
	px, err := newProxy(gw, Policy{Allow: []string{"pypi.org"}, Hosts: map[string]string{"PyPI.org.": "::ffff:1.2.3.4"}})
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
