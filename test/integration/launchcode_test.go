package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// launcherProbe says whether the run's launcher bytecode is mounted, and
// the marker that a test's own bytecode of the launcher sets.
const launcherProbe = "import builtins, os\nprint(os.path.exists('" + launcher.RunCodePath + "'), getattr(builtins, 'marker', None))"

// markedLauncher prints, in base64, bytecode of the run launcher made as
// agentrun's compile makes it, but that sets builtins.marker first.
const markedLauncher = `import sys, marshal, binascii
m = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
src = b"import builtins\nbuiltins.marker = 1\n" + open("` + launcher.RunPath + `", "rb").read()
c = compile(src, "` + launcher.RunPath + `", "exec", dont_inherit=True)
print(binascii.b2a_base64(m + marshal.dumps(c)).decode().strip())`

// noLauncherCode removes the suite's kept launcher bytecode, now and when
// t ends, and returns the directory that keeps it.
func noLauncherCode(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(stateDir, "launcher")
	clear := func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
	}
	clear()
	t.Cleanup(clear)
	return dir
}

// TestLauncherBytecode: a long-lived runner has the image's own
// interpreter compile the run launcher once, in a sandbox of its own, and
// the runs after it, of any runner, load the launcher from that bytecode,
// mounted read-only: a run cannot change it, and its runs give what runs
// of the launcher's source give. Bytecode of another interpreter, or that
// does not load as code, is passed over for the source.
func TestLauncherBytecode(t *testing.T) {
	dir := noLauncherCode(t)
	cfg := testConfig(t)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.MakeLauncherCode()
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		assertNoLeaks(t)
	})
	run := func(code string) *result.Result {
		t.Helper()
		plan, err := task.Load([]byte(pyTask(code, nil)), cfg)
		if err != nil {
			t.Fatal(err)
		}
		res := r.Run(context.Background(), plan, runapi.Hooks{})
		if res.Error != "" || res.ExitCode != 0 {
			t.Fatalf("run: exit %d, %s (stderr %q)", res.ExitCode, res.Error, res.Stderr)
		}
		return res
	}

	if out := run(launcherProbe).Stdout; out != "False None\n" {
		t.Fatalf("the first run: %q, want no bytecode yet", out)
	}
	var file string
	for deadline := time.Now().Add(60 * time.Second); file == ""; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no bytecode in %s a minute after the first run", dir)
		}
		names, _ := filepath.Glob(filepath.Join(dir, "[0-9a-f]*"))
		if len(names) > 1 {
			t.Fatalf("bytecode files %v, want one for the image and python3", names)
		}
		if len(names) == 1 {
			file = names[0]
		}
	}
	code, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	magic := strings.TrimSpace(run("import importlib.util\nprint(importlib.util.MAGIC_NUMBER.hex())").Stdout)
	if len(code) < 1000 || len(code) > 256<<10 || hex.EncodeToString(code[:4]) != magic {
		t.Fatalf("bytecode of %d bytes, magic %x; want the image's python's (%s)", len(code), code[:min(4, len(code))], magic)
	}
	if out := run(launcherProbe).Stdout; out != "True None\n" {
		t.Errorf("a run after the compile: %q, want its bytecode mounted", out)
	}
	res := run(`import errno
for p in ("` + launcher.RunCodePath + `", "` + launcher.StartPath + `", "` + launcher.RunPath + `"):
    try:
        open(p, "r+b").write(b"x")
        print("wrote", p)
    except OSError as e:
        print(p, e.errno in (errno.EROFS, errno.EACCES))`)
	if want := launcher.RunCodePath + " True\n" + launcher.StartPath + " True\n" + launcher.RunPath + " True\n"; res.Stdout != want {
		t.Errorf("writing the launcher's files: %q, want each refused", res.Stdout)
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, code) {
		t.Errorf("the bytecode changed after a run (%v)", err)
	}

	// Its runs are the launcher's: the same outcome as from the source.
	for name, c := range warmCases {
		t.Run(name, func(t *testing.T) {
			fromCode := runIn(t, "libcontainer", pyTask(c, nil))
			if err := os.Rename(file, file+".off"); err != nil {
				t.Fatal(err)
			}
			fromSource := runIn(t, "libcontainer", pyTask(c, nil))
			if err := os.Rename(file+".off", file); err != nil {
				t.Fatal(err)
			}
			if diff := outcomeDiff(fromSource, fromCode); diff != "" {
				t.Errorf("the run from the launcher's bytecode differs from the one from its source:\n%s", diff)
			}
		})
	}

	// Each runner reads what is in the state dir: what loads is used.
	marked, err := base64.StdEncoding.DecodeString(strings.TrimSpace(run(markedLauncher).Stdout))
	if err != nil || len(marked) < 1000 {
		t.Fatalf("the marked launcher's bytecode: %d bytes, %v", len(marked), err)
	}
	other := bytes.Clone(marked)
	other[0] ^= 0xff
	for _, tc := range []struct {
		name string
		code []byte
		want string
	}{
		{"marked", marked, "True 1\n"},
		{"another interpreter's", other, "True None\n"},
		{"not marshal data", append(bytes.Clone(marked[:4]), "\x00\xff\xfe"...), "True None\n"},
		{"cut short", marked[:len(marked)/2], "True None\n"},
		{"a marshalled int", append(bytes.Clone(marked[:4]), 'i', 1, 0, 0, 0), "True None\n"},
	} {
		if err := os.WriteFile(file, tc.code, 0o600); err != nil {
			t.Fatal(err)
		}
		res := runIn(t, "libcontainer", pyTask(launcherProbe, nil))
		if res.Stdout != tc.want || res.ExitCode != 0 {
			t.Errorf("%s bytecode: exit %d, %q (stderr %q); want %q", tc.name, res.ExitCode, res.Stdout, res.Stderr, tc.want)
		}
	}
}

// TestExitEndsLauncherCompile: a long-lived agentrun that ends while the
// run launcher's compile goes on (its first Python run started it), an
// `agentrun mcp --local` whose client leaves and a serve sent SIGTERM,
// ends that compile's sandbox before it exits, and leaves nothing of it
// on the host. A CPU quota of 1% for every sandbox keeps the compile going
// for seconds after the run's answer (its 100 ms timeout): the compile's
// sandbox has the interpreter and the init of libcontainer to run at 1%,
// tens of milliseconds of CPU.
func TestExitEndsLauncherCompile(t *testing.T) {
	slow := map[string]any{"cpus": 0.01}
	compiling := func(t *testing.T) {
		t.Helper()
		if !waitSandboxProcess(t, scope, "marshal", 10*time.Second) {
			t.Fatal("no launcher compile was going on when agentrun was told to end: the test proves nothing")
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"mcp --local", func(t *testing.T) {
			cfg := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir,
				"store_dir": filepath.Join(stateDir, "store"), "limits": slow})
			m := startRawMCP(t, exec.Command(agentrunBin(t), "mcp", "--local", "--config", cfg))
			m.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"print(1)","timeout":"100ms"}}}`)
			m.expect(t, `"id":2`)
			compiling(t)
			m.in.Close()
			m.exits(t)
			if code := m.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("agentrun mcp exited %d; want 0", code)
			}
		}},
		{"serve", func(t *testing.T) {
			cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "agentrun.sock")},
				map[string]any{"local_images": []string{*imagesDir}})
			cfg["limits"] = slow
			s := startServeWith(t, cfg)
			var res result.Result
			s.post(`{"code": "print(1)", "limits": {"timeout": "100ms"}}`, &res)
			if !res.TimedOut {
				t.Errorf("the run: %+v; want it timed out", res)
			}
			compiling(t)
			s.stop()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := noLauncherCode(t)
			tc.run(t)
			assertNoLeaks(t)
			if ents, _ := os.ReadDir(dir); len(ents) > 0 {
				t.Errorf("%s holds %d files after a compile that was stopped", dir, len(ents))
			}
		})
	}
}

// TestLauncherBytecodeCLI: a cold `agentrun run` that finds no launcher
// bytecode for its image runs the launcher's source, answers, and then
// has the image's own interpreter compile it, in a sandbox of its own,
// before it exits; the next cold run loads it, read-only. Nothing of
// either is left behind (cli checks).
func TestLauncherBytecodeCLI(t *testing.T) {
	dir := noLauncherCode(t)
	res, _, stderr, code := cli(t, pyTask(launcherProbe, nil), "run", "-")
	if code != 0 || res == nil || res.Stdout != "False None\n" {
		t.Fatalf("the first cold run: exit %d, %+v, stderr %q; want no bytecode yet", code, res, stderr)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "[0-9a-f]*"))
	if len(names) != 1 {
		t.Fatalf("bytecode files %v after the first cold run's exit, want one for the image and python3", names)
	}
	res, _, stderr, code = cli(t, pyTask(launcherProbe, nil), "run", "-")
	if code != 0 || res == nil || res.Stdout != "True None\n" {
		t.Errorf("the next cold run: exit %d, %+v, stderr %q; want the bytecode mounted", code, res, stderr)
	}
	res, _, _, _ = cli(t, pyTask("x = 6 * 7\nx", nil), "run", "-")
	if res == nil || res.Value == nil || !strings.Contains(fmt.Sprint(res.Value), "42") {
		t.Errorf("a cold run's value from the bytecode: %+v", res)
	}
}
