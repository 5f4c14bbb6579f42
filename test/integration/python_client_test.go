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

// debianPython is the interpreter the Python client is tested with:
// Debian's, run with -S (no site packages: the client needs none).
const debianPython = "/usr/bin/python3"

// TestPythonClient runs the Python client's tests (clients/python/tests)
// with Debian's python3, from the checkout, against a real serve: on its
// unix socket without a token, and on TCP with one. They run tasks,
// stream them, decide held requests through on_approval (the service of
// serviceServeConfig), use sessions, and meet each refusal. The package
// also installs with pip, offline.
func TestPythonClient(t *testing.T) {
	if _, err := os.Stat(debianPython); err != nil {
		t.Fatalf("no %s (test/deps.sh installs python3): %v", debianPython, err)
	}
	for _, mode := range []struct{ name, listen, token string }{
		{"unix", "unix://" + filepath.Join(t.TempDir(), "py.sock"), ""},
		{"tcp", "tcp://127.0.0.1:0", "py-t0ken"},
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
			out := pythonTests(t, address, mode.token)
			if strings.Contains(out, "skipped") && strings.Contains(out, "ServeTest") && strings.Contains(out, "AGENTRUN_TEST") {
				t.Errorf("tests against serve skipped:\n%s", out)
			}
			s.stop()
			assertNoLeaks(t)
		})
	}
	t.Run("pip", func(t *testing.T) {
		// A copy: pip builds in the source tree.
		src, target := filepath.Join(t.TempDir(), "python"), t.TempDir()
		if out, err := exec.Command("cp", "-r", filepath.Join(testenv.RepoRoot(), "clients", "python"), src).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		cmd := exec.Command(debianPython, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
			"--disable-pip-version-check", "--target", target, src)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pip install: %v: %s", err, out)
		}
		cmd = exec.Command(debianPython, "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import agentrun; print(agentrun.__file__, agentrun.__version__)", target)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), filepath.Join(target, "agentrun")) {
			t.Fatalf("import of the installed package: %v: %s", err, out)
		}
	})
}

// pythonTests runs clients/python/tests against the server at address
// and returns their output; a failure fails t.
func pythonTests(t *testing.T, address, token string) string {
	t.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "clients", "python")
	cmd := exec.Command(debianPython, "-S", "-B", "-m", "unittest", "discover", "-v", "-s", "tests")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PYTHONPATH=" + dir, "PYTHONDONTWRITEBYTECODE=1",
		"AGENTRUN_TEST_ADDRESS=" + address, "AGENTRUN_TEST_TOKEN=" + token,
		"AGENTRUN_TEST_SERVICE_URL=https://api.internet.test/api/write/"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python client tests: %v\n%s", err, out)
	}
	t.Logf("python client tests:\n%s", out)
	return string(out)
}
