package netpolicy

import (
	"strings"
	"testing"
)

func TestServiceRules(t *testing.T) {
	svc := &Service{Name: "gh", URL: "https://api.example.com", Rules: []Rule{
		{Methods: []string{"GET", "HEAD"}, Paths: []string{"/repos/**"}},
		{Methods: []string{"POST"}, Paths: []string{"/repos/*/*/issues"}, Approve: true},
		{Methods: []string{"*"}, Paths: []string{"/status", "/v*/meta"}},
		{Methods: []string{"PUT"}, Paths: []string{"/x/a*z/**"}},
	}}
	if err := svc.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, path string
		want         int // index of the rule, -1 for none
	}{
		{"GET", "/repos/a/b", 0},
		{"GET", "/repos", 0},
		{"HEAD", "/repos/a/b/c/d", 0},
		{"POST", "/repos/a/b/issues", 1},
		{"DELETE", "/status", 2},
		{"GET", "/v3/meta", 2},
		// Other methods and paths.
		{"POST", "/repos/a/b", -1},
		{"DELETE", "/repos/a/b", -1},
		{"get", "/repos/a/b", -1},
		{"POST", "/repos/a/b/c/issues", -1},
		{"POST", "/repos/a/issues", -1},
		{"GET", "/user", -1},
		{"GET", "/", -1},
		// Tricks that must not widen a rule.
		{"GET", "/repos/../user", -1},
		{"GET", "/repos/a/../../user", -1},
		{"GET", "/repos/%2e%2e/user", -1},
		{"GET", "/repos/%2E%2E/user", -1},
		{"GET", "/repos/./a", -1},
		{"GET", "/repos/.%2e/user", -1},
		{"POST", "/repos/a%2Fb/c/issues", -1},
		{"POST", "/repos/a%2fb/issues", -1},
		{"POST", "/repos/a%5cb/issues", -1},
		{"GET", "/repos\\..\\user", -1},
		{"GET", "//repos/a", -1},
		{"GET", "/repos//a", -1},
		{"POST", "/repos/a//issues", -1},
		{"GET", "/REPOS/a", -1},
		{"GET", "/Repos/a", -1},
		{"DELETE", "/STATUS", -1},
		{"GET", "/status/", -1},
		{"GET", "/repos/a%00b", -1},
		{"GET", "/repos/a%zz", -1},
		{"GET", "repos/a", -1},
		{"GET", "/repos/a%0ab", -1},
		// Methods that echo the credential back, whatever the rules say.
		{"TRACE", "/status", -1},
		{"trace", "/status", -1},
		{"TRACK", "/status", -1},
		{"Track", "/v3/meta", -1},
		// Fragment and query delimiters, raw or encoded once or twice.
		{"POST", "/repos/a/b#/issues", -1},
		{"GET", "/repos/a#b", -1},
		{"POST", "/repos/a/b%23/issues", -1},
		{"POST", "/repos/a/b%3F/issues", -1},
		{"POST", "/repos/a/b%3f/issues", -1},
		{"POST", "/repos/a/b%2523/issues", -1},
		{"POST", "/repos/a/b%253F/issues", -1},
		{"POST", "/repos/a/b%253f/issues", -1},
		{"GET", "/" + strings.Repeat("a/", 200) + "b", -1},
		// Dot segments as servers that drop ";" parameters (Tomcat,
		// Jetty, Spring) or decode twice read them, and overlong UTF-8
		// encodings of "." and "/".
		{"GET", "/repos/..;/user", -1},
		{"GET", "/repos/.;/user", -1},
		{"GET", "/repos/..;x=1/user", -1},
		{"GET", "/repos/%2e%2e%3b/user", -1},
		{"GET", "/repos/%2e%2e;/user", -1},
		{"GET", "/repos/%2E.;/user", -1},
		{"GET", "/repos/a/..;", -1},
		{"GET", "/repos/a/.;", -1},
		{"GET", "/repos/;x/user", -1},
		{"GET", "/repos/;/user", -1},
		{"GET", "/repos/%3b/user", -1},
		{"GET", "/repos/%252e%252e/user", -1},
		{"GET", "/repos/%252E%252e%253b/user", -1},
		{"GET", "/repos/%c0%ae%c0%ae/user", -1},
		{"GET", "/repos/%C0%AE%C0%AE/user", -1},
		{"GET", "/repos/.%c0%ae/user", -1},
		{"GET", "/repos/%e0%80%ae%e0%80%ae/user", -1},
		{"GET", "/repos/%f0%80%80%ae%f0%80%80%ae/user", -1},
		// Compatibility forms a normalising server reads as "." or "/",
		// and separators encoded twice.
		{"GET", "/repos/%ef%bc%8e%ef%bc%8e/user", -1},
		{"GET", "/repos/\uff0e\uff0e/user", -1},
		{"GET", "/repos/%e2%80%a5/user", -1},
		{"GET", "/repos/.%e2%80%a4/user", -1},
		{"GET", "/repos/%ef%b9%92%ef%b9%92;/user", -1},
		{"GET", "/repos/a%ef%bc%8fb", -1},
		{"GET", "/repos/a%ef%bc%bcb", -1},
		{"GET", "/repos/a%252fb", -1},
		{"GET", "/repos/a%255Cb", -1},
		{"GET", "/repos/caf%c3%a9/%e6%97%a5", 0},
		{"GET", "/repos/%ef%bd%81", 0},
		{"GET", "/repos/..%c0%afuser", -1},
		{"GET", "/repos/..%e0%80%afuser", -1},
		{"GET", "/repos/a%c0%afb", -1},
		{"GET", "/repos/a%ff", -1},
		{"GET", "/repos/a\xc0\xae", -1},
		{"GET", "/repos/%ed%a0%80", -1}, // a surrogate
		// ";" parameters: the path must match as sent and without them.
		{"GET", "/repos/a;x=1/b", 0},
		{"POST", "/repos/a/b/issues;x", -1},
		{"GET", "/v3;x/meta", 2},
		{"GET", "/v;3/meta", 2},
		{"GET", "/status;x", -1},
		{"PUT", "/x/abz/secret", 3},
		{"PUT", "/x/a;z/secret", -1}, // read as /x/a/secret, which the rule does not allow
		// Ordinary non-ASCII text, encoded or not.
		{"GET", "/repos/caf%C3%A9", 0},
		{"GET", "/repos/\u65e5\u672c", 0},
	} {
		r, reason := svc.Match(tc.method, tc.path)
		got := -1
		for i := range svc.Rules {
			if r == &svc.Rules[i] {
				got = i
			}
		}
		if got != tc.want {
			t.Errorf("Match(%q, %q) = rule %d (%s); want %d", tc.method, tc.path, got, reason, tc.want)
		}
		if got == -1 && reason == "" {
			t.Errorf("Match(%q, %q): no rule and no reason", tc.method, tc.path)
		}
	}
	// A percent-encoded ordinary character is the character itself.
	if !matchPath("/repos/**", "/repos/%61") {
		t.Errorf("matchPath(/repos/**, /repos/%%61) = false")
	}
}

func TestServiceConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		svc  Service
		want string
	}{
		{Service{Name: "a", URL: "ftp://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/"}, false}}}, "scheme"},
		{Service{Name: "a", URL: "https://x.example/api", Rules: []Rule{{[]string{"GET"}, []string{"/"}, false}}}, "no user, path"},
		{Service{Name: "a", URL: "https://1.2.3.4", Rules: []Rule{{[]string{"GET"}, []string{"/"}, false}}}, "ip literals"},
		{Service{Name: "a", URL: "https://x.example"}, "no rules"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"get"}, []string{"/"}, false}}}, "upper case"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/a/../b"}, false}}}, "dot segments"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/a//b"}, false}}}, "empty segment"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/a**"}, false}}}, "whole segment"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/**/**/**"}, false}}}, "more than 2"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"a"}, false}}}, "start with /"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/a?"}, false}}}, "wildcards"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/"}, false}},
			Inject: []Inject{{Header: "Host", File: "/s"}}}, "set by the proxy"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/"}, false}},
			Inject: []Inject{{Header: "Bad Header", File: "/s"}}}, "not a valid header"},
		{Service{Name: "a", URL: "https://x.example", Rules: []Rule{{[]string{"GET"}, []string{"/"}, false}},
			Inject: []Inject{{Header: "Authorization", File: "s"}}}, "absolute"},
	} {
		err := tc.svc.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v; want an error with %q", tc.svc, err, tc.want)
		}
	}
}

// matchPath reports whether the request path raw (as sent) matches glob,
// after CleanPath accepts it, with and without its ";" parameters.
func matchPath(glob, raw string) bool {
	segs, reason := CleanPath(raw)
	return reason == "" && matchBoth(glob, segs, withoutParams(segs))
}
