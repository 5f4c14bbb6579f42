package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/test/testenv"
)

// holdingRun is a run that holds one request, as the proxy would, and
// answers with the decision: "approved BY" or "denied BY" ("denied " on
// timeout), or "no way to ask" without an approver.
func holdingRun(timeout time.Duration) runapi.Func {
	return func(ctx context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		res := &result.Result{ID: "ar-held"}
		if hooks.Approve == nil {
			res.Stdout = "no way to ask"
			return res
		}
		actx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		d := hooks.Approve(actx, res.ID, approvals.Approval{ID: "ap-0123", Service: "api", Method: "POST",
			URL: "https://api.test/write", BodyExcerpt: string(p.Code)})
		res.Stdout = map[bool]string{true: "approved ", false: "denied "}[d.Approved] + d.By
		return res
	}
}

// hookReceiver is a webhook: it checks each body's signature with secret
// and passes the holds on.
func hookReceiver(t *testing.T, secret string) (string, chan approvals.Hold) {
	t.Helper()
	holds := make(chan approvals.Hold, 8)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get(approvals.SignatureHeader) != approvals.Sign([]byte(secret), b) {
			t.Errorf("webhook body %s: bad signature %q", b, r.Header.Get(approvals.SignatureHeader))
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var h approvals.Hold
		if err := json.Unmarshal(b, &h); err != nil {
			t.Errorf("webhook body %s: %v", b, err)
		}
		holds <- h
	}))
	t.Cleanup(ts.Close)
	return ts.URL, holds
}

func rootSecret(t *testing.T, secret string) string {
	t.Helper()
	testenv.RequireRoot(t) // the webhook's secret file must be root's
	p := filepath.Join(t.TempDir(), "hook-secret")
	if err := os.WriteFile(p, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// postRun posts a task without a stream in the background.
func postRun(t *testing.T, base, token, code string) chan *result.Result {
	t.Helper()
	out := make(chan *result.Result, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"code": code})
		req, _ := http.NewRequest("POST", base+"/v1/runs", strings.NewReader(string(b)))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			out <- nil
			return
		}
		defer resp.Body.Close()
		var res result.Result
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			t.Error(err)
		}
		out <- &res
	}()
	return out
}

func decideAPI(t *testing.T, base, run, id, body string) int {
	t.Helper()
	resp, err := http.Post(base+"/v1/runs/"+run+"/approvals/"+id, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestWebhookUnattended: a plain POST's held request is announced on the
// webhook, signed, with its run, session and expiry; the API decides it,
// recorded as the webhook's operator or under the caller's label.
// Without a webhook or the page it is denied at once, as before.
func TestWebhookUnattended(t *testing.T) {
	url, holds := hookReceiver(t, "k3y")
	file := rootSecret(t, "k3y")
	ts := testServer(t, func(c *config.Config) {
		c.Server.Approvals = config.Approvals{Webhook: url, WebhookSecretFile: file}
	}, holdingRun(time.Minute))

	res := postRun(t, ts.URL, "", "body one")
	h := <-holds
	if h.Run != "ar-held" || h.ID != "ap-0123" || h.Service != "api" || h.Method != "POST" || h.URL != "https://api.test/write" ||
		h.BodyExcerpt != "body one" || time.Until(h.ExpiresAt) < 30*time.Second {
		t.Errorf("hold %+v", h)
	}
	if !strings.Contains(metricsText(t, ts.URL), "agentrun_approvals_held 1\n") {
		t.Error("metrics: not 1 held")
	}
	if code := decideAPI(t, ts.URL, h.Run, h.ID, `{"approve": true}`); code != 200 {
		t.Errorf("approve: %d", code)
	}
	if r := <-res; r.Stdout != "approved operator (webhook)" {
		t.Errorf("run answered %q", r.Stdout)
	}

	res = postRun(t, ts.URL, "", "body two")
	h = <-holds
	if code := decideAPI(t, ts.URL, h.Run, h.ID, `{"approve": false, "by": "alice\u202e"}`); code != 200 {
		t.Errorf("deny: %d", code)
	}
	if r := <-res; r.Stdout != `denied operator (serve API: alice\u202e)` {
		t.Errorf("run answered %q", r.Stdout)
	}
	m := metricsText(t, ts.URL)
	for _, want := range []string{`agentrun_approvals_decided_total{channel="api",outcome="approved"} 1`,
		`agentrun_approvals_decided_total{channel="api",outcome="denied"} 1`, "agentrun_approvals_held 0\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	plain := testServer(t, nil, holdingRun(time.Minute))
	if r := <-postRun(t, plain.URL, "", "x"); r.Stdout != "no way to ask" {
		t.Errorf("without a webhook: %q", r.Stdout)
	}
}

// TestWebhookFailingTimesOut: a webhook that fails leaves the request
// held until its timeout, then denied and counted.
func TestWebhookFailingTimesOut(t *testing.T) {
	file := rootSecret(t, "k")
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", 500) }))
	defer hook.Close()
	ts := testServer(t, func(c *config.Config) {
		c.Server.Approvals = config.Approvals{Webhook: hook.URL, WebhookSecretFile: file}
	}, holdingRun(time.Second))
	if r := <-postRun(t, ts.URL, "", "x"); r.Stdout != "denied " {
		t.Errorf("run answered %q; want a timeout", r.Stdout)
	}
	if m := metricsText(t, ts.URL); !strings.Contains(m, "agentrun_approvals_timed_out_total 1\n") {
		t.Errorf("metrics: timed out not 1:\n%s", m)
	}
}

// TestApprovalsPage: the page takes the token by login form (a
// HttpOnly, SameSite=Strict cookie) or bearer header, lists held
// requests, and decides with the session's CSRF token only.
func TestApprovalsPage(t *testing.T) {
	ts := testServer(t, func(c *config.Config) {
		c.Server.Token = "t0k"
		c.Server.Approvals.Page = true
	}, holdingRun(time.Minute))
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, string) {
		resp, err := c.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/ui/approvals")
	if !strings.Contains(body, `name="token"`) {
		t.Fatalf("no login form: %d %s", resp.StatusCode, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if resp, _ := get("/ui/approvals.json"); resp.StatusCode != 401 {
		t.Errorf("list without login: %d", resp.StatusCode)
	}
	resp, _ = c.PostForm(ts.URL+"/ui/login", url.Values{"token": {"wrong"}})
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("wrong token: %d", resp.StatusCode)
	}
	resp, _ = c.PostForm(ts.URL+"/ui/login", url.Values{"token": {"t0k"}})
	resp.Body.Close()
	setCookie := resp.Header.Get("Set-Cookie")
	if resp.StatusCode != 303 || !strings.Contains(setCookie, "HttpOnly") || !strings.Contains(setCookie, "SameSite=Strict") || strings.Contains(setCookie, "t0k") {
		t.Fatalf("login: %d, cookie %q", resp.StatusCode, setCookie)
	}
	_, body = get("/ui/approvals")
	m := regexp.MustCompile(`name="csrf-token" content="([0-9a-f]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in the page: %s", body)
	}

	res := postRun(t, ts.URL, "t0k", "<b>hi</b>")
	var list UIList
	for deadline := time.Now().Add(30 * time.Second); len(list.Held) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, body = get("/ui/approvals.json")
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatal(err)
		}
	}
	if len(list.Held) != 1 || list.Held[0].BodyExcerpt != "<b>hi</b>" || list.Held[0].LeftMS <= 0 {
		t.Fatalf("held: %+v", list.Held)
	}
	h := list.Held[0]
	form := url.Values{"run": {h.Run}, "id": {h.ID}, "approve": {"true"}}
	resp, _ = c.PostForm(ts.URL+"/ui/decide", form)
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("decision without CSRF token: %d", resp.StatusCode)
	}
	form.Set("csrf", strings.Repeat("0", len(m[1])))
	resp, _ = c.PostForm(ts.URL+"/ui/decide", form)
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("decision with a wrong CSRF token: %d", resp.StatusCode)
	}
	form.Set("csrf", m[1])
	resp, _ = c.PostForm(ts.URL+"/ui/decide", form)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("decision: %d", resp.StatusCode)
	}
	if r := <-res; r.Stdout != "approved operator (page)" {
		t.Errorf("run answered %q", r.Stdout)
	}
	_, body = get("/ui/approvals.json")
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Held) != 0 || len(list.Recent) != 1 || list.Recent[0].By != "operator (page)" {
		t.Errorf("after the decision: %s", body)
	}
	// The bearer header works without a cookie or CSRF token (a browser
	// never sends it on its own).
	req, _ := http.NewRequest("GET", ts.URL+"/ui/approvals.json", nil)
	req.Header.Set("Authorization", "Bearer t0k")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("bearer: %v %v", resp, err)
	}

	off := testServer(t, nil, okRun)
	if resp, err := http.Get(off.URL + "/ui/approvals"); err != nil || resp.StatusCode != 404 {
		t.Errorf("page off: %v %v", resp, err)
	}
}

// Another site open in the operator's browser cannot decide: not with
// the page's form without its CSRF token when no token is set (every
// request then passes as "bearer"), nor with a cross-site POST to the
// API or the page (a text/plain form can carry a JSON body).
func TestApprovalsCrossSite(t *testing.T) {
	ts := testServer(t, func(c *config.Config) { c.Server.Approvals.Page = true }, holdingRun(time.Minute))
	res := postRun(t, ts.URL, "", "x")
	var list UIList
	for deadline := time.Now().Add(30 * time.Second); len(list.Held) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(ts.URL + "/ui/approvals.json")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
	}
	if len(list.Held) != 1 {
		t.Fatalf("held: %+v", list.Held)
	}
	h := list.Held[0]
	post := func(path, ctype, body string, hdr map[string]string) int {
		return send(t, "POST", ts.URL+path, ctype, body, hdr)
	}
	form := url.Values{"run": {h.Run}, "id": {h.ID}, "approve": {"true"}}.Encode()
	for _, tc := range []struct {
		name, path, ctype, body string
		hdr                     map[string]string
	}{
		{"page form without CSRF token", "/ui/decide", "application/x-www-form-urlencoded", form, nil},
		{"page form, cross-site", "/ui/decide", "application/x-www-form-urlencoded", form, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}},
		{"API, text/plain form from another origin", "/v1/runs/" + h.Run + "/approvals/" + h.ID, "text/plain", `{"approve":true,"by":"="}`, map[string]string{"Origin": "https://evil.example"}},
		{"API, cross-site", "/v1/runs/" + h.Run + "/approvals/" + h.ID, "text/plain", `{"approve":true}`, map[string]string{"Sec-Fetch-Site": "cross-site"}},
	} {
		if code := post(tc.path, tc.ctype, tc.body, tc.hdr); code != 403 {
			t.Errorf("%s: %d; want 403", tc.name, code)
		}
	}
	if code := decideAPI(t, ts.URL, h.Run, h.ID, `{"approve":false,"by":"test"}`); code != 200 {
		t.Errorf("the API's own decision: %d; want 200 (the request still held)", code)
	}
	if r := <-res; r.Stdout != "denied operator (serve API: test)" {
		t.Errorf("run answered %q", r.Stdout)
	}
}

// TestApprovalByKeptApartFromChannels: a name given through the API is
// recorded under the API's label, so that it never reads as a channel's
// own ("by": "page" is not the page's decision, "webhook" not the
// webhook's label); the page's decision keeps its own.
func TestApprovalByKeptApartFromChannels(t *testing.T) {
	ts := testServer(t, func(c *config.Config) { c.Server.Approvals.Page = true }, holdingRun(time.Minute))
	decide := func(body string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			code := decideAPI(t, ts.URL, "ar-held", "ap-0123", body)
			if code == 200 {
				return
			}
			if code != 404 || time.Now().After(deadline) {
				t.Fatalf("decide %s: %d", body, code)
			}
		}
	}
	for by, want := range map[string]string{
		"page":      "approved operator (serve API: page)",
		"webhook":   "approved operator (serve API: webhook)",
		"serve API": "approved operator (serve API: serve API)",
		"nats":      "approved operator (serve API: nats)",
		"alice":     "approved operator (serve API: alice)",
	} {
		res := postRun(t, ts.URL, "", "x")
		decide(fmt.Sprintf(`{"approve": true, "by": %q}`, by))
		if r := <-res; r == nil || r.Stdout != want {
			t.Errorf("by %q: run answered %+v; want %q", by, r, want)
		}
	}
	res := postRun(t, ts.URL, "", "x")
	decide(`{"approve": false}`)
	if r := <-res; r == nil || r.Stdout != "denied operator (serve API)" {
		t.Errorf("no by: run answered %+v", r)
	}
}
