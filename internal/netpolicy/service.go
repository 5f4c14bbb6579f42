package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/agentrun/agentrun/internal/untrusted"
)

// Service is a host the proxy answers for itself (a service of the
// config's network.services): it terminates the
// sandbox's connection (TLS with the run's CA), lets a request through
// only when one of Rules matches it, adds the Inject headers and sends it
// on to the service's URL. The sandbox never sees the injected values.
type Service struct {
	Name   string
	URL    string // "https://host[:port]" or "http://host[:port]", no path
	Inject []Inject
	Rules  []Rule

	// Set by Validate.
	host string // canonical
	port int
	tls  bool
}

// Inject is one header the proxy sets on every request to a service: its
// value is Prefix followed by the content of File (without a final line
// break), read when the request is sent. File must be a regular file owned
// by root that no one else may read or write, of at most MaxSecretBytes.
type Inject struct {
	Header string
	Prefix string
	File   string
}

// Rule lets requests through whose method is one of Methods ("*" is any)
// and whose path matches one of Paths. With Approve, a request it lets
// through is held until the run's approver decides.
type Rule struct {
	Methods []string
	Paths   []string
	Approve bool
}

// Bounds of path matching: a glob's "**" segments and a request path's
// segments (so that matching stays within maxSegments^maxDoubleStars
// steps).
const (
	maxDoubleStars = 2
	maxSegments    = 128
)

// MaxSecretBytes bounds an injected header's file.
const MaxSecretBytes = 16 << 10

// MaxReasonPath bounds the path quoted in a refusal's reason (the
// request's record holds it whole).
const MaxReasonPath = 256

// HopHeaders are the hop-by-hop headers: the proxy never forwards them,
// and a service cannot inject them.
var HopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect",
}

// ParseServiceURL returns the canonical host, the port and whether url is
// https, for a service URL "https://host[:port]" or "http://host[:port]"
// (a trailing "/" is allowed; nothing else after the authority is).
func ParseServiceURL(raw string) (host string, port int, isTLS bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", 0, false, fmt.Errorf("not a URL: %w", err)
	}
	switch u.Scheme {
	case "https":
		isTLS, port = true, 443
	case "http":
		port = 80
	default:
		return "", 0, false, errors.New("scheme must be https or http")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || (u.Path != "" && u.Path != "/") {
		return "", 0, false, errors.New("must be scheme://host[:port] alone: no user, path, query or fragment")
	}
	if p := u.Port(); p != "" {
		if port, err = ParsePort(p); err != nil {
			return "", 0, false, err
		}
	}
	if IsIPLiteral(asciiLower(u.Hostname())) {
		return "", 0, false, errors.New("ip literals are not allowed: name the host")
	}
	h, ok := CanonicalName(u.Hostname())
	if !ok {
		return "", 0, false, errors.New("not a valid host name")
	}
	return h, port, isTLS, nil
}

// CheckHeaderName refuses a header name the proxy may not inject: not an
// HTTP token, or one the proxy itself controls (Host, Content-Length,
// hop-by-hop headers).
func CheckHeaderName(name string) error {
	if name == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return fmt.Errorf("%q is not a valid header name", name)
		}
	}
	for _, h := range append([]string{"Host", "Content-Length", "Content-Type"}, HopHeaders...) {
		if strings.EqualFold(h, name) {
			return fmt.Errorf("%q is set by the proxy and cannot be injected", name)
		}
	}
	return nil
}

func isTokenChar(c byte) bool {
	return c > 0x20 && c < 0x7f && !strings.ContainsRune("\"(),/:;<=>?@[\\]{}", rune(c))
}

// CheckMethod refuses a rule method that is neither "*" nor an HTTP token
// in upper case.
func CheckMethod(m string) error {
	if m == "*" {
		return nil
	}
	if m == "" || m != strings.ToUpper(m) {
		return fmt.Errorf("%q: methods are upper case (GET, POST, ...) or \"*\"", m)
	}
	for i := 0; i < len(m); i++ {
		if !isTokenChar(m[i]) {
			return fmt.Errorf("%q is not a valid method", m)
		}
	}
	return nil
}

// CheckPathGlob refuses a rule path that is not a clean absolute path of
// segments, each literal text, "*" wildcards within a segment, or a whole
// "**" segment.
func CheckPathGlob(g string) error {
	if !strings.HasPrefix(g, "/") {
		return fmt.Errorf("%q: must start with /", g)
	}
	if g == "/" {
		return nil
	}
	if strings.Count(g, "**") > maxDoubleStars {
		return fmt.Errorf("%q: more than %d ** segments", g, maxDoubleStars)
	}
	for _, seg := range strings.Split(g[1:], "/") {
		switch {
		case seg == "":
			return fmt.Errorf("%q: empty segment (//) or trailing /", g)
		case seg == "." || seg == "..":
			return fmt.Errorf("%q: dot segments are not allowed", g)
		case seg != "**" && strings.Contains(seg, "**"):
			return fmt.Errorf("%q: ** must be a whole segment", g)
		case strings.ContainsAny(seg, "?[]\\%"):
			return fmt.Errorf("%q: only * and ** are wildcards; ?, [, ], \\ and %% are not allowed", g)
		}
		if _, err := path.Match(seg, ""); err != nil {
			return fmt.Errorf("%q: %w", g, err)
		}
	}
	return nil
}

// Validate checks the service and fills in what Host, Port, TLS,
// Authority and Origin return. The config validates each of its services
// once, when it is loaded; the proxy takes only validated ones.
func (s *Service) Validate() error {
	h, port, isTLS, err := ParseServiceURL(s.URL)
	if err != nil {
		return fmt.Errorf("service %q: url %q: %w", s.Name, s.URL, err)
	}
	s.host, s.port, s.tls = h, port, isTLS
	if len(s.Rules) == 0 {
		return fmt.Errorf("service %q: no rules: nothing would pass", s.Name)
	}
	for _, in := range s.Inject {
		if err := CheckHeaderName(in.Header); err != nil {
			return fmt.Errorf("service %q: inject: %w", s.Name, err)
		}
		if !strings.HasPrefix(in.File, "/") {
			return fmt.Errorf("service %q: inject %s: file must be an absolute path", s.Name, in.Header)
		}
		if strings.ContainsAny(in.Prefix, "\r\n\x00") {
			return fmt.Errorf("service %q: inject %s: prefix holds a line break or NUL", s.Name, in.Header)
		}
	}
	for i, r := range s.Rules {
		if len(r.Methods) == 0 || len(r.Paths) == 0 {
			return fmt.Errorf("service %q: rules[%d]: needs methods and paths", s.Name, i)
		}
		for _, m := range r.Methods {
			if err := CheckMethod(m); err != nil {
				return fmt.Errorf("service %q: rules[%d]: %w", s.Name, i, err)
			}
		}
		for _, g := range r.Paths {
			if err := CheckPathGlob(g); err != nil {
				return fmt.Errorf("service %q: rules[%d]: %w", s.Name, i, err)
			}
		}
	}
	return nil
}

// Authority is the service's canonical "host:port"; "" before Validate
// accepts it.
func (s *Service) Authority() string {
	if s.host == "" {
		return ""
	}
	return s.authority()
}

// Host is the service's canonical host name, once validated.
func (s *Service) Host() string { return s.host }

// Port is the service's port, once validated.
func (s *Service) Port() int { return s.port }

// TLS reports whether the service's URL is https, once validated.
func (s *Service) TLS() bool { return s.tls }

// authority is the service's "host:port".
func (s *Service) authority() string { return net.JoinHostPort(s.host, strconv.Itoa(s.port)) }

// Origin is the service's scheme://host[:port], once validated.
func (s *Service) Origin() string {
	scheme, def := "http", 80
	if s.tls {
		scheme, def = "https", 443
	}
	if s.port == def {
		return scheme + "://" + s.host
	}
	return scheme + "://" + s.authority()
}

// Match returns the first rule that lets method and the request path
// rawPath (as sent, still percent-encoded) through, or why none does (the
// method and path in it escaped by untrusted.Text). A
// path whose segments carry ";" parameters must match the rule both with
// and without them, as servers that drop them read it.
func (s *Service) Match(method, rawPath string) (*Rule, string) {
	if EchoMethod(method) {
		return nil, "method " + untrusted.Text(method) + " echoes the request (the injected credential included) back: refused to every service"
	}
	segs, reason := CleanPath(rawPath)
	if reason != "" {
		return nil, reason
	}
	bare := withoutParams(segs)
	for i := range s.Rules {
		r := &s.Rules[i]
		if !methodIn(method, r.Methods) {
			continue
		}
		for _, g := range r.Paths {
			if matchBoth(g, segs, bare) {
				return r, ""
			}
		}
	}
	return nil, "no rule of service " + s.Name + " allows " + untrusted.Text(method) + " " + untrusted.Cut(untrusted.Text(rawPath), MaxReasonPath)
}

// EchoMethod reports whether m is TRACE or TRACK in any case: a server
// answers them with the request it got, the injected headers included, so
// they are refused to every service whatever its rules say ("*" included).
func EchoMethod(m string) bool {
	return strings.EqualFold(m, "TRACE") || strings.EqualFold(m, "TRACK")
}

func methodIn(m string, ms []string) bool {
	for _, x := range ms {
		if x == "*" || x == m {
			return true
		}
	}
	return false
}

// CleanPath decodes a request path as sent into its segments, or says why
// it is refused. Anything a server could read as a different path than
// the one matched is refused rather than normalised: dot segments, also
// once their ";" parameters are dropped (Tomcat, Jetty and Spring read
// "..;x" as "..") and once percent-decoded (once or twice: "%2e%2e",
// "%252e"), empty segments (//, "/;x/"), encoded slashes, backslashes and
// NULs, control characters, bad escapes, and invalid UTF-8 once decoded,
// so that no overlong encoding of "." or "/" ("%c0%ae", "%e0%80%af")
// passes. Matching is then exact and case-sensitive, so no spelling of a
// path reaches more than the path itself.
func CleanPath(raw string) ([]string, string) {
	if !strings.HasPrefix(raw, "/") {
		return nil, "path is not absolute"
	}
	if len(raw) > 4096 {
		return nil, "path longer than 4096 bytes"
	}
	if strings.Contains(raw, "#") {
		return nil, "path has a # (RFC 3986 readers end the path there)"
	}
	if raw == "/" {
		return []string{}, ""
	}
	if strings.Count(raw, "/") > maxSegments {
		return nil, fmt.Sprintf("path has more than %d segments", maxSegments)
	}
	var segs []string
	for _, seg := range strings.Split(raw[1:], "/") {
		if seg == "" {
			return nil, "path has an empty segment (//) or ends in /"
		}
		if encodedSeparator(seg) {
			return nil, "path has an encoded slash, backslash or NUL"
		}
		if encodedDelimiter(seg) {
			return nil, "path has an encoded # or ? (a server that decodes it reads a shorter path)"
		}
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return nil, "path has a bad percent escape"
		}
		if encodedSeparator(dec) {
			return nil, "path has a slash, backslash or NUL encoded twice"
		}
		if encodedDelimiter(dec) {
			return nil, "path has a # or ? encoded twice"
		}
		if !utf8.ValidString(dec) {
			return nil, "path has invalid UTF-8 once decoded (an overlong or broken encoding)"
		}
		for i := 0; i < len(dec); i++ {
			if c := dec[i]; c < 0x20 || c == 0x7f || c == '\\' {
				return nil, "path has a control character or backslash"
			}
		}
		if r := dotSegment(seg, dec); r != "" {
			return nil, r
		}
		if r := compatibilityForm(dec); r != "" {
			return nil, r
		}
		segs = append(segs, dec)
	}
	return segs, ""
}

// encodedSeparator reports whether s holds a percent-encoded slash,
// backslash or NUL.
func encodedSeparator(s string) bool {
	lower := strings.ToLower(s)
	return strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(lower, "%00")
}

// encodedDelimiter reports whether s holds a percent-encoded "#" or "?".
func encodedDelimiter(s string) bool {
	lower := strings.ToLower(s)
	return strings.Contains(lower, "%23") || strings.Contains(lower, "%3f")
}

// compatibilityForm says why the decoded segment dec is refused because a
// server that normalises Unicode to its compatibility form (NFKC, as IIS's
// and some frameworks' best-fit mappings do) reads it as a separator or a
// dot segment: a fullwidth solidus (U+FF0F) or reverse solidus (U+FF3C),
// a fullwidth or small full stop (U+FF0E, U+FE52), a one or two dot
// leader (U+2024, U+2025); or "".
func compatibilityForm(dec string) string {
	nf := norm.NFKC.String(dec)
	if nf == dec {
		return ""
	}
	if strings.ContainsAny(nf, "/\\\x00") {
		return "path has a character that normalises to a slash or backslash"
	}
	if r := dotSegment(nf, nf); r != "" {
		return r + " once Unicode-normalised (NFKC)"
	}
	return ""
}

// dotSegment says why the segment seg (as sent; dec decoded) is refused as
// a dot or empty segment in some server's reading, or "".
func dotSegment(seg, dec string) string {
	readings := []string{seg, dec}
	if strings.Contains(dec, "%") {
		// A server or gateway that decodes twice.
		if dec2, err := url.PathUnescape(dec); err == nil {
			readings = append(readings, dec2)
		}
	}
	for _, s := range readings {
		bare, _, params := strings.Cut(s, ";")
		switch {
		case bare == "." || bare == "..":
			if params {
				return "path has a dot segment with ; parameters"
			}
			return "path has a dot segment"
		case bare == "":
			return "path has an empty segment once its ; parameters are dropped"
		}
	}
	return ""
}

// withoutParams returns segs with each segment's ";" parameters dropped,
// or nil when no segment has any.
func withoutParams(segs []string) []string {
	var bare []string
	for i, s := range segs {
		if b, _, ok := strings.Cut(s, ";"); ok {
			if bare == nil {
				bare = append([]string(nil), segs...)
			}
			bare[i] = b
		}
	}
	return bare
}

// trailing slashes in a request ("/repos/") are refused by CleanPath as an
// empty segment; a rule for "/repos/**" covers "/repos" and below.

func globSegments(g string) []string {
	if g == "/" {
		return []string{}
	}
	return strings.Split(g[1:], "/")
}

// matchSegments matches path segments against glob segments: "**" takes
// any number of segments (none included), other glob segments take one
// segment each, "*" within them matching any run of characters.
func matchSegments(glob, segs []string) bool {
	for len(glob) > 0 {
		if glob[0] == "**" {
			rest := glob[1:]
			for i := 0; i <= len(segs); i++ {
				if matchSegments(rest, segs[i:]) {
					return true
				}
			}
			return false
		}
		if len(segs) == 0 {
			return false
		}
		if ok, err := path.Match(glob[0], segs[0]); err != nil || !ok {
			return false
		}
		glob, segs = glob[1:], segs[1:]
	}
	return len(segs) == 0
}

// matchBoth matches segs against glob and, unless nil, bare (segs
// without their ";" parameters) too.
func matchBoth(glob string, segs, bare []string) bool {
	gs := globSegments(glob)
	return matchSegments(gs, segs) && (bare == nil || matchSegments(gs, bare))
}
