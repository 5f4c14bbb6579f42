package endpoint

import (
	"net/http"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/test/oracle"
)

func TestCheckWebhook(t *testing.T) {
	for s, ok := range map[string]bool{
		"https://hooks.internal/agentrun": true, "http://127.0.0.1:9000/h": true,
		"ftp://x/": false, "https://": false, "/relative": false, "https://x/#frag": false, "": false,
	} {
		if err := CheckWebhook(s); (err == nil) != ok {
			t.Errorf("CheckWebhook(%q) = %v", s, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"https://hooks.internal/agentrun/s3cret?key=k": "https://hooks.internal/…",
		"http://u:p@127.0.0.1:9000/h":                  "http://127.0.0.1:9000/…",
		"http://[::1]:8080":                            "http://[::1]:8080/…",
		"/relative/s3cret":                             "…",
		"::not a url s3cret":                           "…",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q; want %q", in, got, want)
		}
	}
	for _, bad := range []string{"ftp://x/s3cret", "https://x/s3cret#frag", "https://x/s3cret\n"} {
		if err := CheckWebhook(bad); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("CheckWebhook(%q) = %v; want an error that does not show the path", bad, err)
		}
	}
}

// CheckWebhook reads a URL as net/http makes a request of it, which the
// webhook then does: it accepts exactly the URLs whose request has an
// http or https scheme, a host and no fragment.
func TestCheckWebhookAsNetHTTP(t *testing.T) {
	cases := append([]string{"http://:/", "http://x:/h", "http://[::1]:/", "http://[::1]/", "https://:443/", "http://x%20y/",
		"http://u@/", "http://%zz/", "HTTP://x/", "https://x/#", "https://x/?q#f", "http://x\x7f/"},
		oracle.Random(7, 2000, 12, "hts:/[]x1%@#?: ")...)
	for _, r := range oracle.Random(8, 20000, 10, "x1:[]%@#?/ ") {
		cases = append(cases, "http://"+r, "https://"+r)
	}
	for _, s := range cases {
		req, err := http.NewRequest(http.MethodPost, s, nil)
		want := err == nil && (req.URL.Scheme == "http" || req.URL.Scheme == "https") &&
			req.URL.Host != "" && req.URL.Fragment == "" && !strings.ContainsAny(s, " \t\r\n")
		if got := CheckWebhook(s); (got == nil) != want {
			t.Errorf("CheckWebhook(%q) = %v; net/http reads it as a webhook's URL: %v", s, got, want)
		}
	}
}
