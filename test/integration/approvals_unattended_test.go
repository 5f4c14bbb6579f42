package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// hookSecret is the approvals webhook's key in these tests.
const hookSecret = "hook-k3y"

// webhook is the operator's approvals webhook on loopback: it checks each
// body's signature against hookSecret and passes the holds on. It
// returns the URL and the root-only secret file for the config.
func webhook(t *testing.T) (url, secretFile string, holds chan approvals.Hold) {
	t.Helper()
	holds = make(chan approvals.Hold, 16)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if r.Header.Get(approvals.SignatureHeader) != approvals.Sign([]byte(hookSecret), b) {
			t.Errorf("webhook: body %s with a bad signature %q", b, r.Header.Get(approvals.SignatureHeader))
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var h approvals.Hold
		if err := json.Unmarshal(b, &h); err != nil {
			t.Errorf("webhook: body %s: %v", b, err)
		}
		holds <- h
	}))
	t.Cleanup(ts.Close)
	secretFile = filepath.Join(t.TempDir(), "approval-hook")
	if err := os.WriteFile(secretFile, []byte(hookSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return ts.URL, secretFile, holds
}

// nextHold waits for the webhook's next hold.
func nextHold(t *testing.T, holds chan approvals.Hold) approvals.Hold {
	t.Helper()
	select {
	case h := <-holds:
		return h
	case <-time.After(60 * time.Second):
		t.Fatal("no hold announced on the webhook")
	}
	return approvals.Hold{}
}

// postBackground posts task to s without a stream and sends the result.
func postBackground(t *testing.T, s *served, task string) chan *result.Result {
	t.Helper()
	out := make(chan *result.Result, 1)
	go func() {
		req, _ := http.NewRequest("POST", s.base+"/v1/runs", strings.NewReader(task))
		if s.token != "" {
			req.Header.Set("Authorization", "Bearer "+s.token)
		}
		var res result.Result
		resp, err := s.client.Do(req)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
		}
		if err != nil {
			t.Errorf("POST /v1/runs: %v", err)
		}
		out <- &res
	}()
	return out
}

// approvalTask posts body to /api/write/N of service api and prints the
// answer.
func approvalTask(n int, body string) string {
	b, _ := json.Marshal(map[string]any{
		"code":    postPy + fmt.Sprintf("print(post(%q, %q))", fmt.Sprintf("/api/write/%d", n), body),
		"network": map[string]any{"services": []string{"api"}},
		"limits":  map[string]any{"timeout": "60s"},
	})
	return string(b)
}

// approvalsOf lists a result's approvals as "approved|denied by BY".
func approvalsOf(res *result.Result) string {
	var out []string
	for _, a := range res.Network.Approvals {
		out = append(out, map[bool]string{true: "approved", false: "denied"}[a.Approved]+" by "+a.By)
	}
	return strings.Join(out, "; ")
}

// TestServeWebhookApprovals: with server.approvals.webhook, a plain POST's
// held request is announced on the webhook, signed, with its run, URL,
// body and expiry, and decided through POST /v1/runs/RUN/approvals/ID:
// approved as the webhook's operator, denied under the caller's label.
// Each decision is in the result and the audit record, and /metrics
// counts them.
func TestServeWebhookApprovals(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "30s")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	url, secret, holds := webhook(t)
	cfg["server"].(map[string]any)["approvals"] = map[string]any{"webhook": url, "webhook_secret_file": secret}
	s := startServeWith(t, cfg)

	res := postBackground(t, s, approvalTask(1, "body 1"))
	h := nextHold(t, holds)
	if h.Service != "api" || h.Method != "POST" || h.URL != "https://api.internet.test/api/write/1" || h.BodyExcerpt != "body 1" ||
		!strings.HasPrefix(h.Run, "ar-") || h.ID == "" || time.Until(h.ExpiresAt) < 10*time.Second || time.Until(h.ExpiresAt) > 31*time.Second {
		t.Errorf("hold %+v", h)
	}
	if code := s.approve(h.Run, h.ID, true); code != 200 {
		t.Errorf("approve: %d", code)
	}
	r := <-res
	if r.Stdout != "200 api POST /api/write/1 body 1\n" || approvalsOf(r) != "approved by operator (webhook)" {
		t.Errorf("approved run: stdout %q, decisions %q (stderr %q)", r.Stdout, approvalsOf(r), r.Stderr)
	}

	res = postBackground(t, s, approvalTask(2, "body 2"))
	h = nextHold(t, holds)
	if resp, _ := s.do("POST", fmt.Sprintf("/v1/runs/%s/approvals/%s", h.Run, h.ID), `{"approve": false, "by": "alice"}`); resp.StatusCode != 200 {
		t.Errorf("deny: %d", resp.StatusCode)
	}
	r = <-res
	if r.Stdout != "403 agentrun: denied by the operator\n" || approvalsOf(r) != "denied by operator (serve API: alice)" {
		t.Errorf("denied run: stdout %q, decisions %q", r.Stdout, approvalsOf(r))
	}
	_, m := s.do("GET", "/metrics", "")
	for _, want := range []string{`agentrun_approvals_decided_total{channel="api",outcome="approved"} 1`,
		`agentrun_approvals_decided_total{channel="api",outcome="denied"} 1`, "agentrun_approvals_held 0"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	s.stop()
	if got := auditDecisions(t, auditPath); got != "approved by operator (webhook); denied by operator (serve API: alice)" {
		t.Errorf("audit decisions: %s", got)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests; want the approved one", len(got))
	}
	assertNoLeaks(t)
}

// TestWorkerApprovals: a worker announces its held request on its
// webhook, and `agentrun approve --nats URL ID yes|no` decides it over
// NATS, saying that a worker took it; a second answer finds no worker
// holding it. Each decision is in the result and the audit record.
func TestWorkerApprovals(t *testing.T) {
	in := proxytest.NewInternet(t)
	scfg, up := serviceServeConfig(t, in, "30s")
	ns := startNATS(t)
	url, secret, holds := webhook(t)
	w := startWorkerCfg(t, map[string]any{"nats": []string{ns.url()},
		"approvals": map[string]any{"webhook": url, "webhook_secret_file": secret}},
		map[string]any{"image": pythonImage, "network": scfg["network"]})
	b := dialBus(t, ns.url())

	approve := func(id, answer string, extra ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(agentrunBin(t), append(append([]string{"approve", "--config", writeConfig(t, map[string]any{}), "--nats", ns.url()}, extra...), id, answer)...)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}

	b.publish("task-approve", approvalTask(1, "body 1"))
	h := nextHold(t, holds)
	if h.URL != "https://api.internet.test/api/write/1" || h.BodyExcerpt != "body 1" || h.Run == "" {
		t.Errorf("hold %+v", h)
	}
	if out, code := approve(h.ID, "yes"); code != 0 || !strings.Contains(out, "approved by operator (nats)") {
		t.Errorf("agentrun approve yes: %d %s", code, out)
	}
	if out, code := approve(h.ID, "no"); code != 1 || !strings.Contains(out, "no worker holds approval") {
		t.Errorf("agentrun approve, a second time: %d %s", code, out)
	}
	b.publish("task-deny", approvalTask(2, "body 2"))
	h = nextHold(t, holds)
	if out, code := approve(h.ID, "no", "--by", "bob"); code != 0 || !strings.Contains(out, "denied by operator (nats: bob)") {
		t.Errorf("agentrun approve no: %d %s", code, out)
	}
	res := b.results([]string{"task-approve", "task-deny"}, 60*time.Second)
	if r := res["task-approve"]; r.Stdout != "200 api POST /api/write/1 body 1\n" || approvalsOf(r) != "approved by operator (nats)" {
		t.Errorf("approved task: stdout %q, decisions %q (stderr %q)", r.Stdout, approvalsOf(r), r.Stderr)
	}
	if r := res["task-deny"]; r.Stdout != "403 agentrun: denied by the operator\n" || approvalsOf(r) != "denied by operator (nats: bob)" {
		t.Errorf("denied task: stdout %q, decisions %q", r.Stdout, approvalsOf(r))
	}
	w.stop()
	if got := auditDecisions(t, w.audit); got != "approved by operator (nats); denied by operator (nats: bob)" {
		t.Errorf("audit decisions: %s", got)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests; want the approved one", len(got))
	}
	assertNoLeaks(t)
}

// hostileBody is a held request's body that would run script or draw
// markup if the page ever inserted it as HTML, with control characters.
const hostileBody = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=1\">\x1b[2J\x07\u202eend"

// TestApprovalsPageNoClickOnAMovedCard: in headless Chromium, a click
// where a request's Approve button was, just after that request went and
// the next moved up into its place, decides nothing; the moved card's
// buttons work once it stayed in place (test/approvals-page/shift.mjs,
// the page's own files with scripted JSON).
func TestApprovalsPageNoClickOnAMovedCard(t *testing.T) {
	out := pageScript(t, "shift.mjs")
	var seen struct {
		AfterMove    []string `json:"afterMove"`
		AfterSettled []string `json:"afterSettled"`
		Error        string   `json:"error"`
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("shift.mjs printed %s: %v", out, err)
	}
	if len(seen.AfterMove) != 0 {
		t.Errorf("a click meant for the request that went decided %q, which had just moved under it", seen.AfterMove)
	}
	if fmt.Sprint(seen.AfterSettled) != "[ap-harmful true]" || seen.Error != "" {
		t.Errorf("the settled card's Approve decided %q (%s); want [ap-harmful true]", seen.AfterSettled, seen.Error)
	}
}

// TestApprovalsPageToolCall: in headless Chromium, the approvals page
// shows a held tool call as its tool server, then its tool and arguments
// labelled as the program's and as inert text (markup in them makes no
// element and runs no script; their escapes stay as they are), never a
// request's method, URL or body; Approve decides it, and a last decision
// on a tool call names its tool and tool server
// (test/approvals-page/tool.mjs, the page's own files with scripted JSON).
func TestApprovalsPageToolCall(t *testing.T) {
	// As the broker escapes them (untrusted.Text): a line break, a
	// bidirectional override and a terminal escape as their escapes.
	tool := untrusted.Text("create_issue<img src=x onerror=\"window.__pwned=1\">\n\u202e")
	args := untrusted.Text(`{"title":"<script>window.__pwned=1</script>","body":"` + "\x1b[2J\n" + `"}`)
	out := pageScript(t, "tool.mjs", tool, args)
	var seen struct {
		Labels, Program, Values, Recent, Decided, Errors []string
		Markup                                           int
		Pwned                                            any
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("tool.mjs printed %s: %v", out, err)
	}
	wantLabels := "[Tool call to tool server Tool (the program's) Arguments, whole (the program's) Run]"
	if fmt.Sprint(seen.Labels) != wantLabels {
		t.Errorf("the card's labels %q; want %s", seen.Labels, wantLabels)
	}
	if len(seen.Program) != 2 || seen.Program[0] != tool || seen.Program[1] != args {
		t.Errorf("the card shows the program's words %q; want exactly [%q %q]", seen.Program, tool, args)
	}
	if fmt.Sprint(seen.Values) != "[github ar-1]" {
		t.Errorf("the card's own values %q; want [github ar-1]", seen.Values)
	}
	if seen.Markup != 0 || seen.Pwned != nil || len(seen.Errors) != 0 {
		t.Errorf("the program's text made %d elements, __pwned %v, page errors %q", seen.Markup, seen.Pwned, seen.Errors)
	}
	if want := "2030-01-01T00:00:00Z: denied by timeout: tool " + tool + " of github (run ar-1)"; len(seen.Recent) != 1 || seen.Recent[0] != want {
		t.Errorf("last decisions %q; want [%q]", seen.Recent, want)
	}
	if fmt.Sprint(seen.Decided) != "[ap-tool true]" {
		t.Errorf("Approve decided %q; want [ap-tool true]", seen.Decided)
	}
}

// pageScript runs the script name of test/approvals-page with args in
// node and returns what it printed.
func pageScript(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("node", append([]string{filepath.Join(approvalsPageDir(t), name)}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s\n%s", name, err, out, stderr.String())
	}
	return out
}

// approvalsPageDir is test/approvals-page with its node modules, once
// Debian's chromium is there.
func approvalsPageDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "test", "approvals-page")
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatal("chromium is missing (test/deps.sh installs Debian's chromium)")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		npm := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		npm.Dir = dir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

const chromiumPath = "/usr/bin/chromium"

// TestApprovalsPageBrowser: serve's approvals page in Debian's headless
// Chromium: log in with the token, see two held requests, the hostile
// body as inert text (no script runs, no element is made of it), approve
// one and deny the other; both runs' results and audit records say the
// page's operator decided.
func TestApprovalsPageBrowser(t *testing.T) {
	dir := approvalsPageDir(t)
	chromium := chromiumPath
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "120s")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	cfg["server"] = map[string]any{"listen": fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), "token": "page-t0k",
		"approvals": map[string]any{"page": true}}
	cfg["policy"].(map[string]any)["timeout"] = "180s"
	s := startServeWith(t, cfg)

	hostile := postBackground(t, s, strings.Replace(approvalTask(1, hostileBody), `"60s"`, `"150s"`, 1))
	plain := postBackground(t, s, strings.Replace(approvalTask(2, "plain"), `"60s"`, `"150s"`, 1))
	var list server.UIList
	for deadline := time.Now().Add(60 * time.Second); len(list.Held) < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("held requests: %+v; log: %s", list.Held, s.log())
		}
		s.get("/ui/approvals.json", &list)
	}
	var hostileID, plainID string
	for _, h := range list.Held {
		switch h.URL {
		case "https://api.internet.test/api/write/1":
			hostileID = h.ID
		case "https://api.internet.test/api/write/2":
			plainID = h.ID
		}
	}
	shown := "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=1\">"
	cmd := exec.Command("node", filepath.Join(dir, "drive.mjs"), s.base, "page-t0k", hostileID, plainID, hostileID, shown)
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromium)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node drive.mjs: %v\n%s\n%s", err, out, stderr.String())
	}
	var seen struct {
		HostileShown   bool     `json:"hostileShown"`
		Pwned          any      `json:"pwned"`
		PwnedAfter     any      `json:"pwnedAfter"`
		MarkupInList   int      `json:"markupInList"`
		CardText       string   `json:"cardText"`
		Recent         []string `json:"recent"`
		Dialogs        []string `json:"dialogs"`
		Errors         []string `json:"errors"`
		CookieHTTPOnly bool     `json:"cookieHttpOnly"`
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("drive.mjs printed %s: %v", out, err)
	}
	if !seen.HostileShown || seen.Pwned != nil || seen.PwnedAfter != nil || seen.MarkupInList != 0 || len(seen.Dialogs) != 0 || len(seen.Errors) != 0 {
		t.Errorf("the hostile body is not inert text: %+v", seen)
	}
	if !seen.CookieHTTPOnly {
		t.Error("the page's cookie is not HttpOnly and SameSite=Strict")
	}
	if len(seen.Recent) < 2 || !strings.Contains(strings.Join(seen.Recent, "\n"), "by operator (page)") {
		t.Errorf("last decisions on the page: %q", seen.Recent)
	}
	r := <-hostile
	if !strings.HasPrefix(r.Stdout, "200 api POST /api/write/1 <script>") || approvalsOf(r) != "approved by operator (page)" {
		t.Errorf("approved run: stdout %q, decisions %q (stderr %q)", r.Stdout, approvalsOf(r), r.Stderr)
	}
	r = <-plain
	if r.Stdout != "403 agentrun: denied by the operator\n" || approvalsOf(r) != "denied by operator (page)" {
		t.Errorf("denied run: stdout %q, decisions %q", r.Stdout, approvalsOf(r))
	}
	_, m := s.do("GET", "/metrics", "")
	for _, want := range []string{`agentrun_approvals_decided_total{channel="page",outcome="approved"} 1`,
		`agentrun_approvals_decided_total{channel="page",outcome="denied"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	s.stop()
	if got := auditDecisions(t, auditPath); !strings.Contains(got, "approved by operator (page)") || !strings.Contains(got, "denied by operator (page)") {
		t.Errorf("audit decisions: %s", got)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests; want the approved one", len(got))
	}
	assertNoLeaks(t)
}
