package netpolicy

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
// Its zero value allows nothing.
type Allowlist struct {
	rules []rule
}

type rule struct {
	name     string // exact name, or the suffix after "*." when wildcard
	wildcard bool   // matches sub.name and deeper, never name itself
	ports    []int
	port     bool // the entry named its port
}

// ParseAllow parses allowlist entries: "pypi.org" (exact), "*.example.com"
// (any name below example.com, not example.com itself), each optionally
// with ":port"; without a port an entry allows 80 and 443. Entries are
// case-insensitive and may end in one dot. URLs, IP literals and wildcards
// other than a leading "*." are refused. A task's entries are checked
// further by CanonicalAllow.
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

// AllowExact adds host (already canonical, see CanonicalName) on port
// alone to a.
func (a *Allowlist) AllowExact(host string, port int) {
	a.rules = append(a.rules, rule{name: host, ports: []int{port}, port: true})
}

// Clone returns a copy of a that AllowExact may grow without changing a;
// a nil a gives an empty allowlist.
func (a *Allowlist) Clone() *Allowlist {
	if a == nil {
		return &Allowlist{}
	}
	return &Allowlist{rules: slices.Clone(a.rules)}
}

// Empty reports whether a allows nothing (nil included).
func (a *Allowlist) Empty() bool { return a == nil || len(a.rules) == 0 }

// Entries returns a's entries in their canonical form, in order (see
// CanonicalAllow): "pypi.org", "*.example.com", "api.example.com:8443".
// A nil a has none.
func (a *Allowlist) Entries() []string {
	if a.Empty() {
		return nil
	}
	out := make([]string, len(a.rules))
	for i, r := range a.rules {
		out[i] = r.entry()
	}
	return out
}

// entry is r written as an allowlist entry, canonical.
func (r rule) entry() string {
	e := r.name
	if r.wildcard {
		e = "*." + e
	}
	if r.port {
		e += ":" + strconv.Itoa(r.ports[0])
	}
	return e
}

// CanonicalAllow checks one allowlist entry as a task writes it and
// returns its canonical form: the grammar of ParseAllow, and the name a
// plain host name as CheckHostname has it (no trailing dot, no "_"),
// lower-cased, its port in plain decimal ("API.example.com:08443" is
// "api.example.com:8443").
func CanonicalAllow(entry string) (string, error) {
	r, err := parseRule(entry)
	if err != nil {
		return "", err
	}
	name := entry
	if i := strings.LastIndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	if err := CheckHostname(strings.TrimPrefix(name, "*.")); err != nil {
		return "", fmt.Errorf("want a host name or \"*.\" + host name, with an optional \":port\": %w", err)
	}
	return r.entry(), nil
}

func parseRule(e string) (rule, error) {
	if hint, ok := urlHost(e); ok {
		return rule{}, fmt.Errorf("a URL, not a host name: give the host name alone (%q), with an optional \":port\"", hint)
	}
	s := strings.TrimSpace(e)
	if s == "" {
		return rule{}, fmt.Errorf("empty")
	}
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") > 1 {
		return rule{}, fmt.Errorf("ip literals are not allowed (use allow_ranges)")
	}
	r := rule{ports: defaultPorts}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := ParsePort(s[i+1:])
		if err != nil {
			return rule{}, err
		}
		r.ports, r.port = []int{p}, true
		s = s[:i]
	}
	s = asciiLower(s)
	if strings.HasPrefix(s, "*.") {
		r.wildcard = true
		s = s[2:]
	}
	s = strings.TrimSuffix(s, ".")
	if strings.Contains(s, "*") {
		return rule{}, fmt.Errorf("a wildcard is only allowed as a leading \"*.\"")
	}
	if IsIPLiteral(s) {
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

// urlHost reports whether entry looks like a URL or a host with a path
// ("https://pypi.org", "pypi.org/simple") and returns the host name it
// names, for the error. Such entries are refused, not normalized: a
// scheme would suggest a port or protocol restriction the allowlist does
// not make.
func urlHost(entry string) (string, bool) {
	rest := entry
	if _, after, ok := strings.Cut(entry, "://"); ok {
		rest = after
	} else if !strings.Contains(entry, "/") {
		return "", false
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	return strings.ToLower(rest), true
}

// ParsePort accepts only plain decimal 1-65535.
func ParsePort(s string) (int, error) {
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
	h, ok := CanonicalName(host)
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
	h, ok := CanonicalName(host)
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

// CanonicalName lower-cases host and drops one trailing dot. It reports
// false for IP literals and anything that is not a plain DNS name.
func CanonicalName(host string) (string, bool) {
	h := strings.TrimSuffix(asciiLower(host), ".")
	if IsIPLiteral(h) || !validName(h) {
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

// IsIPLiteral reports whether h is, or could be read by some resolver as,
// an IP address: any IPv6 form (bracketed, with colons or a zone), dotted
// IPv4, and the inet_aton spellings (3232235777, 0xc0a80101, 0300.0250.1.1,
// 127.1): a name whose last label is all digits or starts with 0x. No real
// top-level domain looks like that.
func IsIPLiteral(h string) bool {
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

// CheckHostname checks DNS host name syntax: at most 253 bytes of dot-separated
// labels of 1-63 letters, digits and inner hyphens, the last label not all
// digits (so IP addresses are refused). No trailing dot.
func CheckHostname(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%q: host name must be 1-253 characters", name)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q: each dot-separated label must be 1-63 characters, not starting or ending with '-'", name)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("%q: invalid character %q in host name", name, c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("%q: IP addresses are not host names", name)
	}
	return nil
}
