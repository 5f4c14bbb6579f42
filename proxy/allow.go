package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// defaultPorts are the ports of an allowlist entry that names none.
var defaultPorts = []int{80, 443}

// Allowlist decides which host:port pairs the sandbox may reach.
type Allowlist struct {
	rules []rule
}

type rule struct {
	name     string // exact name, or the suffix after "*." when wildcard
	wildcard bool   // matches sub.name and deeper, never name itself
	ports    []int
}

// ParseAllow parses allowlist entries: "pypi.org" (exact), "*.example.com"
// (any name below example.com, not example.com itself), each optionally
// with ":port"; without a port an entry allows 80 and 443. Entries are
// case-insensitive and may end in one dot. IP literals and wildcards other
// than a leading "*." are refused.
func ParseAllow(entries []string) (*Allowlist, error) {
	a := &Allowlist{}
	for _, e := range entries {
		r, err := parseRule(e)
		if err != nil {
			return nil, fmt.Errorf("allowlist entry %q: %w", e, err)
		}
		a.rules = append(a.rules, r)
	}
	return a, nil
}

func parseRule(e string) (rule, error) {
	s := strings.TrimSpace(e)
	if s == "" {
		return rule{}, fmt.Errorf("empty")
	}
	if strings.Contains(s, "/") {
		return rule{}, fmt.Errorf("a URL, not a host name: give the host name alone, with an optional \":port\"")
	}
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") > 1 {
		return rule{}, fmt.Errorf("ip literals are not allowed (use allow_ranges)")
	}
	r := rule{ports: defaultPorts}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := parsePort(s[i+1:])
		if err != nil {
			return rule{}, err
		}
		r.ports = []int{p}
		s = s[:i]
	}
	s = asciiLower(s)
	if strings.HasPrefix(s, "*.") {
		r.wildcard = true
		s = s[2:]
	}
	s = strings.TrimSuffix(s, ".")
	if strings.Contains(s, "*") {
		return rule{}, fmt.Errorf("only a leading \"*.\" wildcard is supported")
	}
	if isIPLiteral(s) {
		return rule{}, fmt.Errorf("ip literals are not allowed (use allow_ranges)")
	}
	if !validName(s) {
		return rule{}, fmt.Errorf("not a valid host name")
	}
	if r.wildcard && !strings.Contains(s, ".") {
		return rule{}, fmt.Errorf("wildcard covers a whole top-level domain")
	}
	r.name = s
	return r, nil
}

// parsePort accepts only plain decimal 1-65535.
func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("bad port %q", s)
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return p, nil
}

// Match reports whether host:port is allowed. host is lower-cased and one
// trailing dot is dropped; IP literals and malformed names never match.
func (a *Allowlist) Match(host string, port int) bool {
	h, ok := canonicalName(host)
	if !ok {
		return false
	}
	for _, r := range a.rules {
		if r.matchName(h) && slices.Contains(r.ports, port) {
			return true
		}
	}
	return false
}

// MatchName reports whether host is allowed on any port (for DNS answers).
func (a *Allowlist) MatchName(host string) bool {
	h, ok := canonicalName(host)
	if !ok {
		return false
	}
	for _, r := range a.rules {
		if r.matchName(h) {
			return true
		}
	}
	return false
}

// Ports returns every port some entry allows, sorted.
func (a *Allowlist) Ports() []int {
	var ps []int
	for _, r := range a.rules {
		ps = append(ps, r.ports...)
	}
	slices.Sort(ps)
	return slices.Compact(ps)
}

func (r rule) matchName(h string) bool {
	if !r.wildcard {
		return h == r.name
	}
	return len(h) > len(r.name)+1 && strings.HasSuffix(h, r.name) && h[len(h)-len(r.name)-1] == '.'
}

// canonicalName lower-cases host and drops one trailing dot. It reports
// false for IP literals and anything that is not a plain DNS name.
func canonicalName(host string) (string, bool) {
	h := strings.TrimSuffix(asciiLower(host), ".")
	if isIPLiteral(h) || !validName(h) {
		return "", false
	}
	return h, true
}

// asciiLower lower-cases ASCII letters only (strings.ToLower would fold
// some non-ASCII runes into ASCII ones, such as the Kelvin sign into k).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// validName reports whether h is a lower-case DNS name of letters, digits,
// '-' and '_' with labels of 1-63 bytes, 253 bytes at most, no trailing dot.
func validName(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// isIPLiteral reports whether h is, or could be read by some resolver as,
// an IP address: any IPv6 form (bracketed, with colons or a zone), dotted
// IPv4, and the inet_aton spellings (3232235777, 0xc0a80101, 0300.0250.1.1,
// 127.1): a name whose last label is all digits or starts with 0x. No real
// top-level domain looks like that.
func isIPLiteral(h string) bool {
	if strings.ContainsAny(h, "[]:%") {
		return true
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	h = strings.TrimSuffix(h, ".")
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if strings.TrimLeft(last, "0123456789") == "" {
		return true
	}
	return len(last) >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X')
}
