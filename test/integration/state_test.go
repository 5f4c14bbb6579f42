package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
)

// runStateful runs python code with keep_state in session id, with extra
// task fields (which may unset keep_state), and requires it to succeed.
func runStateful(t testing.TB, r *runner.Runner, cfg *config.Config, id, code string, extra map[string]any) *result.Result {
	t.Helper()
	m := map[string]any{"keep_state": true}
	for k, v := range extra {
		m[k] = v
	}
	res := runSession(t, r, cfg, id, code, m)
	mustOK(t, res)
	return res
}

// TestStateCarriesGlobals: a kept session's globals carry from one call to
// the next, each call a fresh sandbox: numbers, containers, instances,
// functions, lambdas, closures and classes by value, imports by name;
// what cannot carry (an open file, a generator, a lock) is named and never
// fails the call; no process, thread or /tmp file of a call is in the
// next; reset_state clears the state and the files stay. On both
// runtimes.
func TestStateCarriesGlobals(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			cfg := sessionCfg(t, rt, "64m")
			r, id := newSession(t, cfg)
			run := func(code string, extra map[string]any) *result.Result {
				return runStateful(t, r, cfg, id, code, extra)
			}
			res := run(`import json as js
import threading, subprocess
x = 41
data = {"a": [1, 2, 3]}
alias = data
def add(a, b=1): return a + b + x
square = lambda v: v * v
def counter():
    n = 0
    def inc():
        nonlocal n
        n += 1
        return n
    return inc
c = counter(); c(); c()
class P:
    def __init__(self, v): self.v = v
    def twice(self): return P(self.v * 2)
p = P(5)
fh = open("/etc/hostname")
gen = (i for i in range(3))
lock = threading.Lock()
open("/tmp/scratch", "w").write("x")
child = subprocess.Popen(["sleep", "60"])
x`, nil)
			st := res.State
			if st == nil || !st.Saved || st.Bytes <= 0 {
				t.Fatalf("state after call 1: %+v", st)
			}
			for _, name := range []string{"x", "js", "add", "square", "c", "P", "p", "data"} {
				if !slices.Contains(st.Kept, name) {
					t.Errorf("state kept %v: no %s", st.Kept, name)
				}
			}
			for _, name := range []string{"fh", "gen", "lock"} {
				if why := st.Dropped[name]; !strings.Contains(why, "cannot be serialised") {
					t.Errorf("dropped %s: %q", name, why)
				}
			}
			if res.Value["text/plain"] != "41" {
				t.Errorf("value of call 1: %v", res.Value)
			}

			res = run(`import os
alias["a"].append(4)
assert data["a"] == [1, 2, 3, 4], "shared objects stay shared"
assert not os.path.exists("/tmp/scratch"), "a /tmp file of the last call"
assert not [p for p in os.listdir("/proc") if p.isdigit() and "sleep" in open("/proc/%s/cmdline" % p).read()], "a process of the last call"
assert "fh" not in globals() and "gen" not in globals()
(add(1), square(4), c(), p.twice().v, js.dumps([1]))`, nil)
			if got := res.Value["text/plain"]; got != "(43, 16, 3, 10, '[1]')" {
				t.Errorf("call 2's value: %q, stderr %s", got, res.Stderr)
			}

			run("pass", map[string]any{"reset_state": true, "keep_state": false})
			res = run(`print("x" in globals(), os.path.exists("/workspace/main.py") if "os" in globals() else "no os")`, nil)
			if res.Stdout != "False no os\n" {
				t.Errorf("after reset_state: %q", res.Stdout)
			}
		})
	}
	assertNoLeaks(t)
}

// TestStateFailedCallKeepsThePrevious: a call killed by its timeout, one
// that leaves through os._exit and one whose state is past
// sessions.state_max_bytes keep the previous state; an exception keeps
// what the call had done, as a notebook does.
func TestStateFailedCallKeepsThePrevious(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "64m")
	cfg.Sessions.StateMaxBytes = config.MustSize("1m")
	r, id := newSession(t, cfg)
	run := func(code string, extra map[string]any) *result.Result {
		m := map[string]any{"keep_state": true}
		for k, v := range extra {
			m[k] = v
		}
		return runSession(t, r, cfg, id, code, m)
	}
	mustOK(t, run("n = 1", nil))
	if res := run("n = 2\nimport time\ntime.sleep(60)", map[string]any{"limits": map[string]any{"timeout": "1s"}}); !res.TimedOut || res.State == nil || res.State.Saved {
		t.Errorf("timed-out call: timed out %v, state %+v", res.TimedOut, res.State)
	}
	if res := run("n = 3\nimport os\nos._exit(0)", nil); res.State == nil || res.State.Saved {
		t.Errorf("os._exit call: state %+v", res.State)
	}
	if res := run("n = 4\nbig = b'x' * (2 << 20)", nil); res.State == nil || res.State.Saved || !strings.Contains(res.State.Reason, "state_max_bytes") {
		t.Errorf("call past the cap: state %+v", res.State)
	}
	if res := run("print(n)", nil); res.Stdout != "1\n" {
		t.Errorf("after the failed calls n is %q; want the first call's 1", res.Stdout)
	}
	if res := run("n = 5\nraise ValueError('boom')", nil); res.ExitCode != 1 || res.State == nil || !res.State.Saved {
		t.Errorf("call that raised: exit %d, state %+v", res.ExitCode, res.State)
	}
	if res := run("print(n)", nil); res.Stdout != "5\n" {
		t.Errorf("after the call that raised n is %q; want 5", res.Stdout)
	}
}

// TestStateHostileRestoresInSandbox: a state whose restore runs a command
// (a __reduce__) runs it only inside the next call's sandbox: the host
// never reads a state.
func TestStateHostileRestoresInSandbox(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "64m")
	r, id := newSession(t, cfg)
	marker := filepath.Join(t.TempDir(), "ran-on-host")
	res := runSession(t, r, cfg, id, `import os
class Evil:
    def __reduce__(self):
        return (os.system, ("touch `+marker+` /tmp/ran-in-sandbox; echo restored in $(id -u)",))
evil = Evil()`, map[string]any{"keep_state": true})
	mustOK(t, res)
	res = runSession(t, r, cfg, id, `import os
print(os.path.exists("/tmp/ran-in-sandbox"))`, map[string]any{"keep_state": true})
	if !strings.Contains(res.Stdout, "restored in ") || !strings.HasSuffix(res.Stdout, "True\n") || strings.Contains(res.Stdout, "restored in 0\n") {
		t.Errorf("the restore's command: %q", res.Stdout)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the state's command ran on the host")
	}
}

// TestStateWarm: calls in a kept session take warm sandboxes from the
// pool, stateful or not: the session's disk is their /workspace (its
// files, the cwd, nosuid, nodev and noexec as a cold run's), the state
// carries from warm calls to a cold one and back (one format), and no
// process or /tmp file of a call is in the next.
func TestStateWarm(t *testing.T) {
	p := newWarm(t, pythonImage, 1, nil, pyTask("pass", nil), true)
	id := poolSession(t, p)
	call := func(code string, extra map[string]any, warm bool) *result.Result {
		t.Helper()
		m := map[string]any{"session": id, "keep_state": true}
		for k, v := range extra {
			m[k] = v
		}
		p.waitReady(1)
		res := p.run(pyTask(code, m), warm)
		mustOK(t, res)
		return res
	}
	res := call(`import os, subprocess
x = 41
def f(): return x + 1
open("kept.txt", "w").write("k")
open("/tmp/scratch", "w").write("s")
child = subprocess.Popen(["sleep", "60"])
print(os.getcwd(), "main.py" in os.listdir("."))
x`, nil, true)
	if res.Stdout != "/workspace True\n" || res.Value["text/plain"] != "41" || res.State == nil || !res.State.Saved ||
		!slices.Contains(res.State.Kept, "f") {
		t.Fatalf("call 1: stdout %q, value %q, state %+v", res.Stdout, res.Value, res.State)
	}
	res = call(`import os
mounts = [l.split() for l in open("/proc/self/mountinfo")]
ws = [m for m in mounts if m[4] == "/workspace"][-1]
print(f(), open("kept.txt").read(), os.stat("kept.txt").st_uid == os.getuid(), os.path.exists("/tmp/scratch"))
print(all(o in ws[5].split(",") for o in ("nosuid", "nodev", "noexec")), ws[-3], ws[3])
print([q for q in os.listdir("/proc") if q.isdigit() and "sleep" in open("/proc/%s/cmdline" % q).read()])
x += 1`, nil, true)
	if res.Stdout != "42 k True False\nTrue ext4 /\n[]\n" {
		t.Errorf("call 2: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	// Another shape (memory) misses the pool: a cold call, whose state
	// the next warm one restores.
	res = call("x += 1\nprint(x)", map[string]any{"limits": map[string]any{"memory": "300m"}}, false)
	if res.Stdout != "43\n" {
		t.Errorf("cold call: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	res = call("print(open('kept.txt').read(), 'x' in globals())", map[string]any{"keep_state": false, "keep_workspace": true}, true)
	if res.Stdout != "k False\n" || res.State != nil {
		t.Errorf("a warm call without state: stdout %q, stderr %q, state %+v", res.Stdout, res.Stderr, res.State)
	}
	if res = call("print(x)", nil, true); res.Stdout != "43\n" {
		t.Errorf("warm call after the cold one: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
}

// forgeState is a program that writes a state of its own making
// (agentrun_state.py's format, MAGIC and all: the module is readable)
// where the launcher keeps the session's, holding planted, a global of mb
// MiB, and n = 99; with report, it writes the launcher's report too,
// saying that it saved it. Then it leaves through os._exit, before the
// launcher's end.
func forgeState(mb int, report bool) string {
	code := fmt.Sprintf(`import os, json
ns = {}
exec(compile(open(%q).read(), "state", "exec"), ns)
rep = ns["dump"]({"planted": b"p" * (%d << 20), "n": 99}, %q, 1 << 40)
assert rep["saved"], rep
`, launcher.StatePath, mb, launcher.StateFile)
	if report {
		code += `open("/dev/agentrun-display/state", "w").write(json.dumps(rep))
`
	}
	return code + "os._exit(0)\n"
}

// TestStateForgedByTheProgram: the state a call leaves is the session's
// only once the launcher reports a clean save and the host finds it
// within sessions.state_max_bytes by its size: a program that writes a
// 20 MiB state where the launcher keeps it and leaves through os._exit,
// with or without a forged report, keeps the previous state, and the next
// call restores that one; the session's state on the host stays within
// the cap throughout. The launcher's copy in the disk is the program's to
// write: the next call gets the host's copy there again. On both runtimes.
func TestStateForgedByTheProgram(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			cfg := sessionCfg(t, rt, "64m")
			cfg.Sessions.StateMaxBytes = config.MustSize("1m")
			r, id := newSession(t, cfg)
			run := func(code string) *result.Result {
				t.Helper()
				return runSession(t, r, cfg, id, code, map[string]any{"keep_state": true,
					"limits": map[string]any{"memory": "512m", "timeout": "60s"}})
			}
			hostState := filepath.Join(cfg.StoreDir, "sessions", id, "state")
			withinCap := func(when string) {
				t.Helper()
				fi, err := os.Lstat(hostState)
				if err != nil || !fi.Mode().IsRegular() || fi.Size() > 1<<20 {
					t.Errorf("%s: the session's state on the host: %v, %v", when, fi, err)
				}
			}
			mustOK(t, run("n = 1"))
			withinCap("after a clean save")
			if res := run(forgeState(20, false)); res.State == nil || res.State.Saved {
				t.Errorf("forged state, no report: state %+v, stderr %s", res.State, res.Stderr)
			}
			withinCap("after a forged state")
			res := run(forgeState(20, true))
			if res.State == nil || res.State.Saved || !strings.Contains(res.State.Reason, "state_max_bytes") {
				t.Errorf("forged state and report: state %+v, stderr %s", res.State, res.Stderr)
			}
			withinCap("after a forged state and report")
			res = run(`print(n, "planted" in globals())`)
			mustOK(t, res)
			if res.Stdout != "1 False\n" {
				t.Errorf("after the forged calls: %q; want the first call's n and no planted global", res.Stdout)
			}
			// A fifo or a link where the state should be, reported as
			// saved: never opened through, never waited on.
			for what, make := range map[string]string{
				"fifo": "os.mkfifo(path)",
				"link": "os.symlink('/etc/passwd', path)",
			} {
				res := run(fmt.Sprintf(`import os, json
path = %q
os.remove(path)
%s
open("/dev/agentrun-display/state", "w").write(json.dumps({"kept": ["n"], "dropped": {}, "bytes": 1, "saved": True}))
os._exit(0)`, launcher.StateFile, make))
				if res.State == nil || res.State.Saved {
					t.Errorf("a %s reported as the state: %+v", what, res.State)
				}
			}
			withinCap("after a fifo and a link")
			// A state within the cap that the program wrote and reported
			// itself is its own: kept (the documented residual).
			if res := run(forgeState(0, true)); res.State == nil || !res.State.Saved {
				t.Errorf("forged state within the cap, reported: %+v", res.State)
			}
			if res := run("print(n)"); res.Stdout != "99\n" {
				t.Errorf("after a reported state within the cap: %q", res.Stdout)
			}
		})
	}
	assertNoLeaks(t)
}

// TestStateRequestPlantedLink: code that runs in a warm sandbox before its
// take (here a preloaded module of the image's) plants state-request, the
// name agentrun writes a stateful run's request under at the take, as a
// link to a host path: to a file of root's alone, or to one that does not
// exist. agentrun writes its request, not through the link: the host's
// file keeps its bytes and mode, nothing is created, and the run reads
// agentrun's request (its state is saved).
func TestStateRequestPlantedLink(t *testing.T) {
	host := t.TempDir()
	victim, absent := filepath.Join(host, "victim"), filepath.Join(host, "absent")
	if err := os.WriteFile(victim, []byte("root's own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The python image, its files hard links to the cache's (an image's
	// rootfs is mounted read-only), with the planting modules beside its
	// standard library.
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-al", filepath.Join(*imagesDir, "python", "rootfs"), rootfs).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	for mod, target := range map[string]string{"plant_victim": victim, "plant_absent": absent} {
		code := fmt.Sprintf("import os\nos.symlink(%q, '/dev/agentrun-display/state-request')\n", target)
		if err := os.WriteFile(filepath.Join(rootfs, "usr", "lib", "python3.11", mod+".py"), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ref := "dir:" + rootfs
	for _, mod := range []string{"plant_victim", "plant_absent"} {
		t.Run(mod, func(t *testing.T) {
			p := newWarm(t, ref, 1, []string{mod}, pyTask("pass", map[string]any{"image": ref}), true)
			id := poolSession(t, p)
			code := "import os\nprint(os.readlink('/dev/agentrun-display/state-request') if os.path.islink('/dev/agentrun-display/state-request') else 'file')\nx = 1"
			hits := p.pool.Stats().Hits
			res := p.r.Run(context.Background(), p.plan(pyTask(code, map[string]any{"image": ref, "session": id, "keep_state": true})), runapi.Hooks{})
			if p.pool.Stats().Hits == hits {
				t.Error("the run did not take the warm sandbox")
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "root's own\n" {
				t.Errorf("the host's file now holds %q (%v)", b, err)
			}
			if fi, err := os.Stat(victim); err != nil || fi.Mode() != 0o600 {
				t.Errorf("the host's file: %v, %v; want mode 0600", fi, err)
			}
			if _, err := os.Lstat(absent); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a file was made on the host at %s: %v", absent, err)
			}
			mustOK(t, res)
			if res.Stdout != "file\n" || res.State == nil || !res.State.Saved || !slices.Contains(res.State.Kept, "x") {
				t.Errorf("stdout %q, stderr %q, state %+v; want agentrun's request read and the state saved", res.Stdout, res.Stderr, res.State)
			}
		})
	}
}

// poolSession is a kept session of p's runner, removed at the test's end.
func poolSession(t *testing.T, p *pooled) string {
	t.Helper()
	id, err := p.r.Sessions().Create()
	if err != nil {
		t.Fatalf("creating session: %v", err)
	}
	t.Cleanup(func() {
		if err := p.r.Sessions().Remove(id); err != nil {
			t.Errorf("removing session: %v", err)
		}
	})
	return id
}
