package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/proxy/proxytest"
)

// elicitor is an MCP client's answer to elicitations: accept with
// approve true while approve is set, else decline; it keeps the messages
// it was asked.
type elicitor struct {
	mu      sync.Mutex
	asked   []string
	approve bool
}

// connect connects a client that answers elicitations (e) or, with e nil,
// one that does not offer them, to the agentrun mcp of cmd.
func (e *elicitor) connect(t *testing.T, cmd *exec.Cmd) *mcp.ClientSession {
	t.Helper()
	var opts *mcp.ClientOptions
	if e != nil {
		opts = &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.asked = append(e.asked, req.Params.Message)
			if e.approve {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}, nil
			}
			return &mcp.ElicitResult{Action: "decline"}, nil
		}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, opts).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// approvalArgs is a run_code call whose POST is held for approval.
var approvalArgs = map[string]any{"code": postPy + `print(post("/api/write/7", "seven"))`, "network_services": []string{"api"}, "timeout": "30s"}

// grantThenDecline makes the held POST of approvalArgs twice through cs,
// its client e accepting, then declining: the first reaches upstream
// with the credential, the second is denied by the operator.
func (e *elicitor) grantThenDecline(t *testing.T, cs *mcp.ClientSession, up *proxytest.HeaderLog) {
	t.Helper()
	e.mu.Lock()
	e.approve = true
	e.mu.Unlock()
	res := call(t, cs, approvalArgs)
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "200 api POST /api/write/7 seven") {
		t.Fatalf("granted: %v %q", res.IsError, text)
	}
	e.mu.Lock()
	if len(e.asked) != 1 || !strings.Contains(e.asked[0], "POST https://api.internet.test/api/write/7") || !strings.Contains(e.asked[0], "seven") {
		t.Errorf("elicitation messages: %q", e.asked)
	}
	e.approve = false
	e.mu.Unlock()
	res = call(t, cs, approvalArgs)
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "403 agentrun: denied by the operator") {
		t.Fatalf("declined: %v %q", res.IsError, text)
	}
	if got := up.Got(); len(got) != 1 || got[0] != "Bearer "+serviceSecret {
		t.Errorf("upstream got %q; want the approved request only, with the credential", got)
	}
}

// auditDecisions lists the approval decisions of the audit log at path,
// in order, as "approved by WHO" or "denied by WHO".
func auditDecisions(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var decisions []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec struct {
			Network struct {
				Approvals []struct {
					Approved bool   `json:"approved"`
					By       string `json:"by"`
				} `json:"approvals"`
			} `json:"network"`
		}
		json.Unmarshal([]byte(line), &rec)
		for _, a := range rec.Network.Approvals {
			decisions = append(decisions, map[bool]string{true: "approved", false: "denied"}[a.Approved]+" by "+a.By)
		}
	}
	return strings.Join(decisions, "; ")
}

// TestMCPElicitApproval: `agentrun mcp` asks its client, through MCP
// elicitation, to decide a request held for approval; the client's accept
// lets it through and its decline denies it, and each decision is in the
// audit record.
func TestMCPElicitApproval(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "20s")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	delete(cfg, "server")
	cmd := exec.Command(agentrunBin(t), "mcp", "--local", "--config", writeConfig(t, cfg))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stderr = os.Stderr
	e := &elicitor{}
	cs := e.connect(t, cmd)
	e.grantThenDecline(t, cs, up)
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	if got := auditDecisions(t, auditPath); got != "approved by mcp client (elicitation); denied by mcp client (elicitation)" {
		t.Errorf("audit decisions: %s", got)
	}
	assertNoLeaks(t)
}

// TestMCPForwardElicitApproval: an unprivileged `agentrun mcp` that
// forwards to serve passes serve's question about a held request on to its
// client as an elicitation, and the client's answer back: accepted, the
// request reaches upstream; declined, the program gets 403; a client
// without elicitation is not asked (denied, as on the direct path). serve's
// audit record names who decided each.
func TestMCPForwardElicitApproval(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceServeConfig(t, in, "20s")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	dir := clientDir(t)
	sock := filepath.Join(dir, "agentrun.sock")
	cfg["server"] = map[string]any{"listen": "unix://" + sock}
	s := startServeWith(t, cfg)
	if err := os.Chown(sock, 0, 65534); err != nil {
		t.Fatal(err)
	}
	forwarder := func() *exec.Cmd {
		cmd := unprivilegedMCP(t, dir, "AGENTRUN_SERVER=unix://"+sock)
		cmd.Stderr = os.Stderr
		return cmd
	}
	e := &elicitor{}
	cs := e.connect(t, forwarder())
	e.grantThenDecline(t, cs, up)
	cs.Close()

	plain := (*elicitor)(nil).connect(t, forwarder())
	res := call(t, plain, approvalArgs)
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "403 agentrun: denied by the operator") {
		t.Fatalf("a client without elicitation: %v %q", res.IsError, text)
	}
	plain.Close()
	s.stop()
	if got := auditDecisions(t, auditPath); got != "approved by mcp client (elicitation); denied by mcp client (elicitation); denied by no way to ask" {
		t.Errorf("audit decisions: %s", got)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %q; want the approved request only", got)
	}
	assertNoLeaks(t)
}

// TestMCPElicitShownEscaped: the elicitation `agentrun mcp` sends about a
// held request with a hostile body is agentrun's four lines, the
// program's words escaped on two of them (no line, control, format or
// invalid character of its own), labelled as the program's.
func TestMCPElicitShownEscaped(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, _ := serviceServeConfig(t, in, "20s")
	delete(cfg, "server")
	cmd := exec.Command(agentrunBin(t), "mcp", "--local", "--config", writeConfig(t, cfg))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stderr = os.Stderr
	e := &elicitor{approve: true}
	cs := e.connect(t, cmd)
	res := call(t, cs, map[string]any{"code": hostilePy + `print(postb("/api/write/7", HOSTILE))`, "network_services": []string{"api"}, "timeout": "30s"})
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "200") {
		t.Fatalf("granted: %v %q", res.IsError, text)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.asked) != 1 {
		t.Fatalf("asked %d times; want 1", len(e.asked))
	}
	lines := strings.Split(e.asked[0], "\n")
	for i, l := range lines {
		if bad := proxytest.Unshowable(l); bad != "" {
			t.Errorf("elicitation line %d %q holds %s", i, l, bad)
		}
	}
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "agentrun: the sandboxed program asks to send this request to service api (as the program wrote it, escaped") ||
		lines[1] != "  POST https://api.internet.test/api/write/7" || lines[2] != "  body: "+hostileShown || lines[3] != "Approve this request?" {
		t.Errorf("elicitation message:\n%s", e.asked[0])
	}
	cs.Close()
	assertNoLeaks(t)
}
