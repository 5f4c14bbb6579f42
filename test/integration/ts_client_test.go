package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestTypeScriptClient runs the TypeScript client's tests
// (clients/typescript/test, node's test runner) against a real serve: on
// its unix socket without a token, and on TCP with one. They run tasks,
// stream them, decide held requests through onApproval (the service of
// serviceServeConfig), use sessions, meet refusals, and invoke each
// adapter as its framework does (the AI SDK tool's execute, the LangChain
// tool's invoke, the Agents SDK tool's invoke and its sandbox client's
// sessions), without a model.
func TestTypeScriptClient(t *testing.T) {
	removeNewSessions(t)
	dir := tsClient(t)
	for _, mode := range []struct{ name, listen, token string }{
		{"unix", "unix://" + filepath.Join(t.TempDir(), "ts.sock"), ""},
		{"tcp", "tcp://127.0.0.1:0", "ts-t0ken"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			cfg, _ := serviceServeConfig(t, proxytest.NewInternet(t), "20s")
			srv := map[string]any{"listen": mode.listen, "max_concurrent": 2, "queue": 0,
				"quota": map[string]any{"runs_per_minute": 3, "concurrent": 0}}
			if mode.token != "" {
				srv["token"] = mode.token
			}
			cfg["server"] = srv
			s := startServeWith(t, cfg)
			address := s.base
			if strings.HasPrefix(mode.listen, "unix://") {
				address = mode.listen
			}
			cmd := exec.Command("node", "--test", "--test-concurrency=1", "--test-reporter=spec", "test/")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "AGENTRUN_TEST_ADDRESS="+address, "AGENTRUN_TEST_TOKEN="+mode.token,
				"AGENTRUN_TEST_SERVICE_URL=https://api.internet.test/api/write/", "NO_COLOR=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("typescript client tests: %v\n%s", err, out)
			}
			t.Logf("typescript client tests:\n%s", out)
			if strings.Contains(string(out), "no agentrun serve") {
				t.Errorf("tests against serve skipped:\n%s", out)
			}
			s.stop()
			assertNoLeaks(t)
		})
	}
}

// tsClient builds clients/typescript (npm ci when its packages are
// missing, as make ts-client does, then tsc) and returns its directory.
func tsClient(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "clients", "typescript")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is missing (test/deps.sh installs nodejs and npm)")
	}
	steps := [][]string{{"npm", "run", "build"}}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "typescript")); err != nil {
		steps = append([][]string{{"npm", "ci", "--no-audit", "--no-fund"}}, steps...)
	}
	for _, step := range steps {
		cmd := exec.Command(step[0], step[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s in %s: %v\n%s", strings.Join(step, " "), dir, err, out)
		}
	}
	return dir
}
