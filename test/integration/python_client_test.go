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
// serviceServeConfig), use sessions, contexts and live sandboxes, and
// meet each refusal. The package also installs as its README says, with
// no network (pythonInstall).
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
	t.Run("install", func(t *testing.T) { pythonInstall(t) })
}

// pythonInstall installs the client as clients/python/README.md says, in
// a fresh venv of Debian's python3 with no network at all (a network
// namespace of its own: only the build backend beside pyproject.toml can
// build it), then type-checks a program using it with mypy (py.typed, the
// results' typed dicts) and runs a call against a real serve with the
// venv's python.
func pythonInstall(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "clients", "python", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var install []string
	for _, line := range strings.Split(string(readme), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "pip" && f[1] == "install" {
			install = f[:3]
			break
		}
	}
	if strings.Join(install, " ") != "pip install ./clients/python" {
		t.Fatalf("README's install command %q; want pip install ./clients/python", install)
	}
	// A copy of the checkout's client, where the README's command is run
	// from (pip may write in the source tree).
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "clients"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-r", filepath.Join(testenv.RepoRoot(), "clients", "python"), filepath.Join(root, "clients")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(debianPython, "-m", "venv", venv).CombinedOutput(); err != nil {
		t.Fatalf("python3 -m venv (test/deps.sh installs python3-venv): %v: %s", err, out)
	}
	env := []string{"PATH=" + filepath.Join(venv, "bin") + ":/usr/bin:/bin", "HOME=" + t.TempDir(), "PIP_DISABLE_PIP_VERSION_CHECK=1",
		"PIP_NO_CACHE_DIR=1", "PYTHONDONTWRITEBYTECODE=1"}
	cmd := exec.Command("unshare", append([]string{"--net", "--"}, install...)...)
	cmd.Dir, cmd.Env = root, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s, offline: %v: %s", strings.Join(install, " "), err, out)
	}
	site, _ := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages", "agentrun", "py.typed"))
	if len(site) != 1 {
		t.Fatalf("no agentrun/py.typed in the venv: %s", out)
	}

	// The installed package is typed (PEP 561): mypy, run with the venv's
	// python, reads a run's result as agentrun.Result and refuses a
	// wrong key and a wrong use of a field.
	prog := filepath.Join(t.TempDir(), "prog.py")
	if err := os.WriteFile(prog, []byte(`import agentrun
c = agentrun.Client("unix:///nonexistent")
r: agentrun.Result = c.run(code="print(1)")
n: int = r["exit_code"]
with c.sandboxes.create() as sb:
    p: agentrun.ProcessResult = sb.exec("true")
bad1 = r["no_such_key"]
bad2: int = r["stdout"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(debianPython, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir=/dev/null",
		"--python-executable", filepath.Join(venv, "bin", "python"), prog)
	cmd.Dir, cmd.Env = t.TempDir(), env
	out, _ = cmd.CombinedOutput()
	got := string(out)
	if !strings.Contains(got, `TypedDict "Result" has no key "no_such_key"`) || !strings.Contains(got, "prog.py:8: error: Incompatible types") ||
		strings.Count(got, ": error:") != 2 {
		t.Errorf("mypy of a program using the installed package (test/deps.sh installs python3-mypy): want exactly lines 7 and 8 refused:\n%s", got)
	}

	// The venv's python, from outside the checkout, against a real serve.
	sock := filepath.Join(t.TempDir(), "py.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock})
	cmd = exec.Command(filepath.Join(venv, "bin", "python"), "-c", `import sys, agentrun
print(agentrun.__file__)
r = agentrun.Client(sys.argv[1]).run(code="print(6 * 7)")
print(r["stdout"], end="")`, "unix://"+sock)
	cmd.Dir, cmd.Env = t.TempDir(), env
	out, err = cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) != 2 || !strings.HasPrefix(lines[0], filepath.Join(venv, "lib")) || lines[1] != "42" {
		t.Errorf("a run from the venv: %v: %s", err, out)
	}
	s.stop()
	assertNoLeaks(t)
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
