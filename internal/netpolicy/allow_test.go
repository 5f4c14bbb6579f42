package netpolicy

import (
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
		if !IsIPLiteral(h) {
			t.Errorf("IsIPLiteral(%q) = false; want true", h)
		}
	}
	for _, h := range []string{"pypi.org", "1e100.net", "0x.example.com", "123.example", "localhost"} {
		if IsIPLiteral(h) {
			t.Errorf("IsIPLiteral(%q) = true; want false", h)
		}
	}
}

// CanonicalAllow is ParseAllow's grammar with a plain host name: what it
// accepts the proxy accepts, in the same canonical form.
func TestCanonicalAllow(t *testing.T) {
	for in, want := range map[string]string{
		"pypi.org":              "pypi.org",
		"PyPI.org":              "pypi.org",
		"*.pythonhosted.org":    "*.pythonhosted.org",
		"*.A.example:443":       "*.a.example:443",
		"api.example.com:08443": "api.example.com:8443",
		"localhost":             "localhost",
		"123.example":           "123.example",
		"xn--bcher-kva.example": "xn--bcher-kva.example",
	} {
		got, err := CanonicalAllow(in)
		if err != nil || got != want {
			t.Errorf("CanonicalAllow(%q) = %q, %v; want %q", in, got, err, want)
			continue
		}
		if _, err := ParseAllow([]string{got}); err != nil {
			t.Errorf("ParseAllow(%q) = %v; want its canonical form accepted", got, err)
		}
	}
	for _, in := range []string{
		"", " pypi.org", "pypi.org ", "a.com.", "-a.com", "a-.com", "a_b.com", "a..com", ".a.com",
		"*", "*.", "*.com", "a.*.com", "*.*.a.com", "foo*.com",
		"1.2.3.4", "169.254.169.254", "0x1", "a.0x1", "a.123", "[::1]:443", "::1",
		"a.com:0", "a.com:65536", "a.com:+80", "a.com:", "a.com:000080", "a.com:80:80",
		"\u212aa.com", // Kelvin sign: strings.ToLower would read it as "ka.com"
		"\uff41.com",  // fullwidth a
		"https://pypi.org", "pypi.org/simple",
	} {
		if got, err := CanonicalAllow(in); err == nil {
			t.Errorf("CanonicalAllow(%q) = %q; want an error", in, got)
		}
	}
}

func TestAllowlistEntriesAndClone(t *testing.T) {
	a, err := ParseAllow([]string{"PyPI.org.", "*.Pythonhosted.org", "api.example.com:08443"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"pypi.org", "*.pythonhosted.org", "api.example.com:8443"}
	if got := a.Entries(); !slices.Equal(got, want) {
		t.Errorf("Entries() = %q; want %q", got, want)
	}
	c := a.Clone()
	c.AllowExact("api.service.test", 8080)
	if !c.Match("api.service.test", 8080) || a.Match("api.service.test", 8080) {
		t.Error("AllowExact on a clone: the clone must match and the original must not")
	}
	if got := a.Entries(); !slices.Equal(got, want) {
		t.Errorf("Entries() after a clone grew = %q; want %q", got, want)
	}
	var none *Allowlist
	if !none.Empty() || none.Entries() != nil || !none.Clone().Empty() || a.Empty() {
		t.Error("Empty, Entries or Clone disagree on a nil allowlist")
	}
	if none.Clone().Match("pypi.org", 443) {
		t.Error("the clone of a nil allowlist matched")
	}
}
