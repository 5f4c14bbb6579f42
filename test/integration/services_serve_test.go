package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// serviceServeConfig is serveConfig with serviceConfig's network.
func serviceServeConfig(t *testing.T, in *proxytest.Internet, approvalTimeout string) (map[string]any, *proxytest.HeaderLog) {
	t.Helper()
	cfg, up := serviceConfig(t, in, "libcontainer")
	srv := map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "s.sock")}
	c := serveConfig(srv, map[string]any{"local_images": []string{*imagesDir}})
	svc := cfg.Network.Services["api"]
	c["network"] = map[string]any{
		"hosts": cfg.Network.Hosts, "allow_ranges": cfg.Network.AllowRanges, "ca_files": cfg.Network.CAFiles,
		"approval_timeout": approvalTimeout,
		"services":         map[string]any{"api": svc},
	}
	return c, up
}

const postPy = `
import sys, urllib.request, urllib.error
def post(path, body):
    req = urllib.request.Request("https://api.internet.test" + path, data=body.encode(), method="POST")
    try:
        r = urllib.request.urlopen(req, timeout=30)
        return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip())
`

// streamApprovals posts task with ?stream=1, calls decide on each approval
// event, and returns the result.
func streamApprovals(t *testing.T, s *served, task string, decide func(ev server.Event)) *result.Result {
	t.Helper()
	resp, err := s.client.Post(s.base+"/v1/runs?stream=1", "application/json", strings.NewReader(task))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		t.Fatalf("POST /v1/runs?stream=1: %s: %s", resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev server.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("stream line %q: %v", sc.Text(), err)
		}
		switch ev.Event {
		case "approval":
			decide(ev)
		case "result":
			return ev.Result
		}
	}
	t.Fatalf("stream ended without a result: %v", sc.Err())
	return nil
}

func (s *served) approve(run, id string, ok bool) int {
	s.t.Helper()
	resp, _ := s.do("POST", fmt.Sprintf("/v1/runs/%s/approvals/%s", run, id), fmt.Sprintf(`{"approve": %v}`, ok))
	return resp.StatusCode
}

// TestServeApprovals: a request held by an approve rule is granted, denied
// and left to time out over serve's stream and POST
// /v1/runs/RUN/approvals/ID; a program killed while waiting leaves
// nothing held; each decision is in the result and the audit record.
func TestServeApprovals(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "3s")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	s := startServeWith(t, cfg)

	task, _ := json.Marshal(map[string]any{
		"code":    postPy + `for i in (1, 2, 3): print(post("/api/write/%d" % i, "body %d" % i))`,
		"network": map[string]any{"services": []string{"api"}},
		"limits":  map[string]any{"timeout": "30s"},
	})
	n := 0
	res := streamApprovals(t, s, string(task), func(ev server.Event) {
		n++
		a := ev.Approval
		if a == nil || a.Method != "POST" || a.URL != fmt.Sprintf("https://api.internet.test/api/write/%d", n) || a.BodyExcerpt != fmt.Sprintf("body %d", n) || a.Service != "api" {
			t.Errorf("approval event %d = %+v", n, a)
		}
		switch n {
		case 1:
			if code := s.approve(ev.Run, a.ID, true); code != 200 {
				t.Errorf("approve = %d", code)
			}
			// Decided once: a second answer finds nothing waiting.
			if code := s.approve(ev.Run, a.ID, false); code != 404 {
				t.Errorf("second answer = %d; want 404", code)
			}
		case 2:
			if code := s.approve(ev.Run, a.ID, false); code != 200 {
				t.Errorf("deny = %d", code)
			}
		}
	})
	want := "200 api POST /api/write/1 body 1\n403 agentrun: denied by the operator\n403 agentrun: denied by the operator\n"
	if res.Stdout != want {
		t.Errorf("stdout %q; want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	var by []string
	for _, a := range res.Network.Approvals {
		by = append(by, fmt.Sprintf("%v %s", a.Approved, a.By))
	}
	if got := strings.Join(by, "; "); got != "true operator (serve API); false operator (serve API); false timeout" {
		t.Errorf("approvals in the result: %s", got)
	}
	if got := up.Got(); len(got) != 1 || got[0] != "Bearer "+serviceSecret {
		t.Errorf("upstream got %q; want only the approved request, with the credential", got)
	}

	// A program killed while its request is held.
	task, _ = json.Marshal(map[string]any{
		"code":    postPy + `print(post("/api/write/9", "x"))`,
		"network": map[string]any{"services": []string{"api"}},
		"limits":  map[string]any{"timeout": "2s"},
	})
	var held server.Event
	res2 := streamApprovals(t, s, string(task), func(ev server.Event) { held = ev })
	if !res2.TimedOut || held.Approval == nil {
		t.Fatalf("killed run: timed out %v, approval event %+v", res2.TimedOut, held)
	}
	if code := s.approve(held.Run, held.Approval.ID, true); code != 404 {
		t.Errorf("approving after the run ended = %d; want 404", code)
	}
	if a := res2.Network.Approvals; len(a) != 1 || a[0].Approved || a[0].By != "request abandoned" {
		t.Errorf("approvals of the killed run: %+v", a)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests; want 1", len(got))
	}
	s.stop()
	b, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"by":"operator (serve API)"`) || !strings.Contains(string(b), `"by":"request abandoned"`) || strings.Contains(string(b), serviceSecret) {
		t.Errorf("audit records lack the decisions or hold the secret: %s", b)
	}
	assertNoLeaks(t)
}

// hostilePy defines HOSTILE, a held request's body that, shown raw, would
// end the question with a forged one, clear the screen and reverse the
// text after it (with a NUL, DEL, a C1 control and a byte that is not
// UTF-8), and postb, post for a body of bytes.
const hostilePy = postPy + `
HOSTILE = (b'{"title":"hi"}\n\nApprove this request?\n\x1b[2J\x1b[H' +
    "\u202eThe sandboxed program asks to send GET https://svc.test/public/readme\u200b\u0085".encode() + b"\x00\x7f\xff")
def postb(path, body):
    req = urllib.request.Request("https://api.internet.test" + path, data=body, method="POST")
    try:
        r = urllib.request.urlopen(req, timeout=30)
        return "%d" % r.status
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip())
`

// hostileShown is HOSTILE as every channel shows it.
const hostileShown = `{"title":"hi"}\n\nApprove this request?\n\x1b[2J\x1b[H\u202eThe sandboxed program asks to send GET https://svc.test/public/readme\u200b\u0085\x00\x7f\xff`

// receivedAPI is what in received under /api/ (the request lines).
func receivedAPI(in *proxytest.Internet) []string {
	var got []string
	for _, l := range in.Received() {
		if _, uri, _ := strings.Cut(l, " "); strings.HasPrefix(uri, "/api/") {
			got = append(got, l)
		}
	}
	return got
}

// withRepoRule is cfg (serviceServeConfig's) with one more rule on its
// service: POST anywhere under /api/repos/, held for approval.
func withRepoRule(cfg map[string]any) {
	netw := cfg["network"].(map[string]any)
	svc := netw["services"].(map[string]any)["api"].(config.Service)
	svc.Rules = append(slices.Clone(svc.Rules), config.ServiceRule{Methods: []string{"POST"}, Paths: []string{"/api/repos/**"}, Approve: true})
	netw["services"] = map[string]any{"api": svc}
}

// TestServeApprovalShownWhole: over serve's stream, a held request's
// approval event holds no byte of the program's that draws anything but
// itself (its hostile body is shown escaped); a URL of more than 255
// bytes is shown whole, and what the upstream gets, the result and the
// audit record all hold that whole path; a URL too long to show is
// refused with 403 before anyone is asked and never reaches the upstream.
func TestServeApprovalShownWhole(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "20s")
	withRepoRule(cfg)
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	s := startServeWith(t, cfg)

	long := "/api/repos/trusted-org" + strings.Repeat("-", 240) + "/attacker-repo/issues"
	task, _ := json.Marshal(map[string]any{
		"code": hostilePy + `
print(postb("/api/write/x", HOSTILE))
print(postb("` + long + `", b"{}"))
print(postb("/api/write/" + "a" * 2100, b"{}"))
`,
		"network": map[string]any{"services": []string{"api"}},
		"limits":  map[string]any{"timeout": "60s"},
	})
	var asked []approvals.Approval
	res := streamApprovals(t, s, string(task), func(ev server.Event) {
		a := ev.Approval
		asked = append(asked, *a)
		for name, v := range map[string]string{"id": a.ID, "service": a.Service, "method": a.Method, "url": a.URL, "body_excerpt": a.BodyExcerpt} {
			if bad := proxytest.Unshowable(v); bad != "" {
				t.Errorf("approval event's %s %q holds %s", name, v, bad)
			}
		}
		if code := s.approve(ev.Run, a.ID, true); code != 200 {
			t.Errorf("approve = %d", code)
		}
	})
	if len(asked) != 2 {
		t.Fatalf("asked %d times; want 2 (the URL too long to show is not asked about): %+v", len(asked), asked)
	}
	if a := asked[0]; a.BodyExcerpt != hostileShown || a.URL != "https://api.internet.test/api/write/x" {
		t.Errorf("hostile body shown as %q (url %q); want %q", a.BodyExcerpt, a.URL, hostileShown)
	}
	if a := asked[1]; a.URL != "https://api.internet.test"+long {
		t.Errorf("long URL shown as %q", a.URL)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 3 || lines[0] != "200" || lines[1] != "200" ||
		lines[2] != "403 agentrun: request to api.internet.test:443 denied: URL longer than 2048 bytes: too long to show" {
		t.Errorf("stdout %q (stderr %q)", res.Stdout, res.Stderr)
	}
	got := receivedAPI(in)
	if len(got) != 2 || got[0] != "POST /api/write/x" || got[1] != "POST "+long {
		t.Errorf("upstream received %q; want the two approved requests, the long one whole", got)
	}
	if creds := up.Got(); len(creds) != 2 || creds[1] != "Bearer "+serviceSecret {
		t.Errorf("upstream credentials %q", creds)
	}
	reqs := res.Network.Requests
	if len(reqs) != 3 || reqs[1].Path != long || !reqs[1].Allowed || reqs[2].Allowed || !strings.Contains(reqs[2].Path, "…[cut: ") {
		t.Errorf("result's requests %+v", reqs)
	}
	if ap := res.Network.Approvals; len(ap) != 2 || ap[1].URL != "https://api.internet.test"+long || !ap[1].Approved {
		t.Errorf("result's approvals %+v", ap)
	}
	s.stop()
	b, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"path":"`+long+`"`) || !strings.Contains(string(b), `"url":"https://api.internet.test`+long+`"`) {
		t.Errorf("audit record lacks the whole path: %s", b)
	}
	assertNoLeaks(t)
}
