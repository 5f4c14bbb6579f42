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
	cmd := exec.Command(agentrunBin(t), "mcp", "--config", writeConfig(t, cfg))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stderr = os.Stderr

	var mu sync.Mutex
	var asked []string
	approve := true
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, req.Params.Message)
			if approve {
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}, nil
			}
			return &mcp.ElicitResult{Action: "decline"}, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	args := map[string]any{"code": postPy + `print(post("/api/write/7", "seven"))`, "network_services": []string{"api"}, "timeout": "30s"}
	res := call(t, cs, args)
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "200 api POST /api/write/7 seven") {
		t.Fatalf("granted: %v %q", res.IsError, text)
	}
	mu.Lock()
	if len(asked) != 1 || !strings.Contains(asked[0], "POST https://api.internet.test/api/write/7") || !strings.Contains(asked[0], "seven") {
		t.Errorf("elicitation messages: %q", asked)
	}
	approve = false
	mu.Unlock()
	res = call(t, cs, args)
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "403 agentrun: denied by the operator") {
		t.Fatalf("declined: %v %q", res.IsError, text)
	}
	if got := up.Got(); len(got) != 1 || got[0] != "Bearer "+serviceSecret {
		t.Errorf("upstream got %q; want the approved request only, with the credential", got)
	}
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	b, err := os.ReadFile(auditPath)
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
	if got := strings.Join(decisions, "; "); got != "approved by mcp client (elicitation); denied by mcp client (elicitation)" {
		t.Errorf("audit decisions: %s", got)
	}
	assertNoLeaks(t)
}
