package netpolicy

import "testing"

// FuzzCanonicalAllow: an entry CanonicalAllow accepts has a canonical form
// that ParseAllow accepts and CanonicalAllow keeps as it is, and that
// allows the name it names.
func FuzzCanonicalAllow(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.Example.com:08443", "a.com.", "0x1", "https://a.com/x", "\u212aa.com", "a.com:80:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		canon, err := CanonicalAllow(entry)
		if err != nil {
			return
		}
		a, err := ParseAllow([]string{canon})
		if err != nil {
			t.Fatalf("CanonicalAllow(%q) = %q, which ParseAllow refuses: %v", entry, canon, err)
		}
		if again, err := CanonicalAllow(canon); err != nil || again != canon {
			t.Fatalf("CanonicalAllow(%q) = %q, %v; want it unchanged", canon, again, err)
		}
		r, _ := parseRule(canon)
		name := r.name
		if r.wildcard {
			name = "x." + name
		}
		if len(name) <= 253 && !a.Match(name, r.ports[0]) {
			t.Fatalf("ParseAllow(%q) does not allow %s:%d", canon, name, r.ports[0])
		}
	})
}
