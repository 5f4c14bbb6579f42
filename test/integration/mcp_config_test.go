package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPFindsServeByConfig: `agentrun mcp --config F` as root looks for
// serve at F's server.listen (a socket of the test's own, behind F's
// token), not at the default socket: it forwards its calls there (serve
// counts the run) and says so on stderr; with that serve stopped, it says
// that it runs sandboxes here, and does.
func TestMCPFindsServeByConfig(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "alt.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "token": "sekrit"})
	mcpWith := func(stderr *strings.Builder) *exec.Cmd {
		cmd := exec.Command(agentrunBin(t), "mcp", "--config", s.config)
		cmd.Env = []string{"PATH=/usr/bin:/bin"} // no $AGENTRUN_SERVER, no $AGENTRUN_TOKEN
		hideDefaultServer(t, cmd)
		cmd.Stderr = stderr
		return cmd
	}
	ran := func() (n float64) {
		for k, v := range s.scrape() {
			if strings.HasPrefix(k, `agentrun_runs_total{outcome="ok",`) {
				n += v
			}
		}
		return n
	}

	var forwarded strings.Builder
	cs := mcpClient(t, &mcp.CommandTransport{Command: mcpWith(&forwarded)})
	if res := call(t, cs, map[string]any{"code": "print(7)"}); res.IsError || structured(t, res).Stdout != "7\n" {
		t.Fatalf("run_code: %q", answerText(t, res))
	}
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	if n := ran(); n != 1 {
		t.Errorf("serve at F's server.listen ran %v runs; want the call's one", n)
	}
	if want := "agentrun mcp: using serve at unix://" + sock + "\n"; !strings.Contains(forwarded.String(), want) {
		t.Errorf("stderr %q; want %q", forwarded.String(), want)
	}
	s.stop()

	var local strings.Builder
	cs = mcpClient(t, &mcp.CommandTransport{Command: mcpWith(&local)})
	if res := call(t, cs, map[string]any{"code": "print(8)"}); res.IsError || structured(t, res).Stdout != "8\n" {
		t.Fatalf("run_code with no serve: %q", answerText(t, res))
	}
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	if want := "agentrun mcp: no serve at unix://" + sock + ": running sandboxes here (cold, slower)\n"; !strings.Contains(local.String(), want) {
		t.Errorf("stderr %q; want %q", local.String(), want)
	}
	assertNoLeaks(t)
}
