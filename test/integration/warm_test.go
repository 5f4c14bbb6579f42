package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/runtime/spec"
)

// newWarm is a runner whose pool keeps n warm sandboxes of image ref
// (python's "python" language) with preload imported, seeded with the
// shape of seedTask; it waits for them unless wait is false.
func newWarm(t *testing.T, ref string, n int, preload []string, seedTask string, wait bool) *pooled {
	t.Helper()
	cfg := testConfig(t)
	cfg.Server.Pool = map[string]config.PoolEntry{ref: {Count: n, Warm: &config.Warm{Language: "python", Preload: preload}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p := newPooledCfg(t, cfg, seedTask)
	if wait {
		waitReady(t, p.pool, ref, n)
	}
	return p
}

// warmState is what the pool says of image ref's warm sandboxes.
func warmState(p *pooled, ref string) string { return p.pool.Stats().Warm[ref] }

// warmProbe prints what a program can see of how it was started.
const warmProbe = `import sys, os, atexit
m = sys.modules["__main__"]
print("name", __name__, m is sys.modules[__name__])
print("argv", sys.argv, "orig", getattr(sys, "orig_argv", None))
print("file", __file__, "path0", sys.path[0], "cwd", os.getcwd())
print("main", sorted(k for k in vars(m) if k.startswith("__")), repr(m.__loader__.name), m.__loader__.path, m.__spec__, m.__package__, m.__cached__, m.__doc__)
print("stdin", repr(sys.stdin.read()))
print("env", os.environ.get("PROBE"), sorted(k for k in os.environ))
print("files", sorted(os.listdir("/workspace")), open("/workspace/data.txt").read())
print("flags", sys.flags, sys.stdout.encoding, sys.stdout.line_buffering, sys.stdin.encoding)
print("fds", sorted(os.listdir("/proc/self/fd")))
print("recursion", sys.getrecursionlimit())
print("modules", sorted(sys.modules))
atexit.register(lambda: print("atexit ran"))
print("to stderr", file=sys.stderr)
`

// warmCases are programs whose result (exit status, signal, output) a warm
// run must give as a cold one does.
var warmCases = map[string]string{
	"probe":     warmProbe,
	"exit":      "import sys\nprint('out')\nsys.exit(3)",
	"exit-msg":  "import sys\nsys.exit('bye')",
	"exit-none": "raise SystemExit",
	"raise": `import atexit
atexit.register(lambda: print("atexit after the traceback"))
def f():
    raise ValueError("boom")
f()`,
	"chained":       "try:\n    1/0\nexcept Exception as e:\n    raise KeyError('k') from e",
	"syntax":        "print('a'\nx = ",
	"keyboard":      "raise KeyboardInterrupt",
	"signal":        "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)",
	"abort":         "import os\nos.abort()",
	"excepthook":    "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, v)\nraise RuntimeError('x')",
	"unbuffered":    "import sys\nsys.stdout.write('no newline')\nsys.stderr.write('err no newline')\nimport os\nos._exit(5)",
	"cap":           "print('y' * 5000)",
	"pickle":        "import pickle\nclass C: pass\nprint(type(pickle.loads(pickle.dumps(C()))).__qualname__)",
	"doc":           "'''the doc'''\nprint(__doc__)",
	"thread":        "import threading, time\ndef f():\n    time.sleep(0.3)\n    print('thread done')\nthreading.Thread(target=f).start()\nprint('main done')",
	"daemon":        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\nprint('main done')",
	"atexit-raises": "import atexit\nclass F:\n    def __repr__(self): return 'F'\n    def __call__(self): raise ValueError('in atexit')\natexit.register(F())\nprint('main')",
	"exit-big":      "import sys\nsys.exit(259)",
	"exit-neg":      "import sys\nsys.exit(-1)",
	"exit-obj":      "import sys\nsys.exit(['a', 1])",
}

// TestWarmRunsAsCold: each case gives the same result warm and cold: exit
// status, signal, stdout and stderr (tracebacks included). With no
// preload, the warm interpreter's modules are a cold one's; the probe
// sees argv, __file__, sys.path[0], cwd, stdin, env, files, fds and
// __main__ as a cold run does.
func TestWarmRunsAsCold(t *testing.T) {
	extra := map[string]any{"stdin": "some input\n", "env": map[string]string{"PROBE": "yes"},
		"files":  map[string]any{"data.txt": map[string]string{"content": "data"}},
		"limits": map[string]any{"output_bytes": 4000}}
	p := newWarm(t, pythonImage, 2, nil, pyTask("pass", extra), true)
	if st := warmState(p, pythonImage); st != runapi.WarmOK {
		t.Fatalf("warm state %q; want %q", st, runapi.WarmOK)
	}
	for name, code := range warmCases {
		t.Run(name, func(t *testing.T) {
			taskJSON := pyTask(code, extra)
			cold := runOnly(t, testConfig(t), nil, taskJSON)
			warm := p.run(taskJSON, true)
			if st := warmState(p, pythonImage); st != runapi.WarmOK {
				t.Fatalf("warm state %q after the run; want %q", st, runapi.WarmOK)
			}
			if diff := outcomeDiff(cold, warm); diff != "" {
				t.Errorf("warm run differs from the cold one:\n%s", diff)
			}
			if name == "probe" && !strings.Contains(warm.Stdout, "atexit ran") {
				t.Errorf("probe output %q", warm.Stdout)
			}
			p.waitReady(2)
		})

	}
}

// outcomeDiff says how a and b differ in what the program did.
func outcomeDiff(a, b *result.Result) string {
	type outcome struct {
		Exit               int
		Signal             string
		TimedOut, OOM      bool
		Stdout, Stderr     string
		OutTrunc, ErrTrunc bool
		OutBytes, ErrBytes int64
		Error              string
	}
	oa := outcome{a.ExitCode, a.Signal, a.TimedOut, a.OOMKilled, a.Stdout, a.Stderr, a.StdoutTruncated, a.StderrTruncated, a.StdoutBytes, a.StderrBytes, a.Error}
	ob := outcome{b.ExitCode, b.Signal, b.TimedOut, b.OOMKilled, b.Stdout, b.Stderr, b.StdoutTruncated, b.StderrTruncated, b.StdoutBytes, b.StderrBytes, b.Error}
	if oa == ob {
		return ""
	}
	ja, _ := json.MarshalIndent(oa, "", "  ")
	jb, _ := json.MarshalIndent(ob, "", "  ")
	return "cold: " + string(ja) + "\nwarm: " + string(jb)
}

// TestWarmPreloadIsInSysModules: a preloaded module is already imported
// when the task starts; the rest of sys.modules is a cold run's plus what
// the preload imported; a task's env with PYTHON* variables runs plain.
func TestWarmPreloadIsInSysModules(t *testing.T) {
	p := newWarm(t, pythonImage, 1, []string{"json", "decimal"}, pyTask("pass", nil), true)
	code := "import sys\nprint('json' in sys.modules, 'decimal' in sys.modules, 'fractions' in sys.modules)"
	if res := p.run(pyTask(code, nil), true); res.Stdout != "True True False\n" {
		t.Fatalf("warm run printed %q", res.Stdout)
	}
	if res := runOnly(t, testConfig(t), nil, pyTask(code, nil)); res.Stdout != "False False False\n" {
		t.Fatalf("cold run printed %q", res.Stdout)
	}
	// PYTHON* changes the interpreter's start: such a task never runs warm.
	p.waitReady(1)
	env := map[string]any{"env": map[string]string{"PYTHONDONTWRITEBYTECODE": "1"}}
	if res := p.run(pyTask(code, env), false); res.Stdout != "False False False\n" {
		t.Fatalf("a PYTHON* task printed %q; want a cold interpreter's", res.Stdout)
	}
}

// TestWarmRunsAreIsolated: what one warm run changes (a module's
// attribute, a file in /tmp, the environment) is not seen by the next:
// each has its own sandbox and interpreter.
func TestWarmRunsAreIsolated(t *testing.T) {
	p := newWarm(t, pythonImage, 2, []string{"json"}, pyTask("pass", nil), true)
	code := `import json, os, sys
print(getattr(json, "mark", None), os.path.exists("/tmp/mark"), os.environ.get("MARK"), os.getpid())
json.mark = 1
open("/tmp/mark", "w").write("x")
os.environ["MARK"] = "1"
sys.modules["planted"] = json`
	first := p.run(pyTask(code, nil), true)
	p.waitReady(2)
	second := p.run(pyTask(code+"\nprint('planted' in sys.modules)", nil), true)
	for _, res := range []*result.Result{first, second} {
		if !strings.HasPrefix(res.Stdout, "None False None ") || res.ExitCode != 0 {
			t.Fatalf("a warm run saw another's changes: %q (exit %d, stderr %q)", res.Stdout, res.ExitCode, res.Stderr)
		}
	}
	if first.ID == second.ID {
		t.Fatalf("two runs in sandbox %s", first.ID)
	}
}

// TestWarmTimeoutAndOOM: a warm run's timeout and memory limit end it as
// a cold run's do, and its usage is its own.
func TestWarmTimeoutAndOOM(t *testing.T) {
	limits := map[string]any{"limits": map[string]any{"timeout": "3s", "memory": "64m"}}
	p := newWarm(t, pythonImage, 1, []string{"json"}, pyTask("pass", limits), true)
	res := p.run(pyTask("print('spinning', flush=True)\nwhile True: pass", limits), true)
	if !res.TimedOut || res.ExitCode != result.ExitTimeout || res.Stdout != "spinning\n" {
		t.Fatalf("timed out %v, exit %d, stdout %q; want a timeout", res.TimedOut, res.ExitCode, res.Stdout)
	}
	p.waitReady(1)
	res = p.run(pyTask("b = b'x' * (200 << 20)\nprint('survived')", limits), true)
	if !res.OOMKilled || res.ExitCode != 137 || res.MemoryPeakBytes < 32<<20 {
		t.Fatalf("oom %v, exit %d, peak %d, stdout %q; want an OOM kill", res.OOMKilled, res.ExitCode, res.MemoryPeakBytes, res.Stdout)
	}
}

// TestWarmPreloadMissing: a preload the image lacks fails the warm
// sandboxes, never a run: the image gets plain pooled sandboxes, and the
// pool says why.
func TestWarmPreloadMissing(t *testing.T) {
	p := newWarm(t, pythonImage, 1, []string{"json", "no_such_module_here"}, pyTask("pass", nil), false)
	deadline := time.Now().Add(60 * time.Second)
	for warmState(p, pythonImage) == runapi.WarmOK {
		if time.Now().After(deadline) {
			t.Fatalf("the pool never gave up its warm sandboxes: %+v", p.pool.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := warmState(p, pythonImage); !strings.Contains(st, "no_such_module_here") || !strings.Contains(st, "ModuleNotFoundError") {
		t.Fatalf("warm state %q; want the missing module named", st)
	}
	p.waitReady(1)
	res := p.run(pyTask("import sys\nprint('json' in sys.modules)", nil), true)
	if res.Stdout != "False\n" || res.ExitCode != 0 {
		t.Fatalf("run on the plain pool: exit %d, stdout %q", res.ExitCode, res.Stdout)
	}
}

// TestWarmLauncherKilledBeforeTake: a warm sandbox whose launcher died
// while it waited is not given to a run; the run goes on as if it had not
// been there.
func TestWarmLauncherKilledBeforeTake(t *testing.T) {
	p := newWarm(t, pythonImage, 1, []string{"json"}, pyTask("pass", nil), true)
	if n := killLaunchers(t); n != 1 {
		t.Fatalf("killed %d launchers; want 1", n)
	}
	res := p.r.Run(context.Background(), p.plan(pyTask("print(6 * 7)", nil)), runapi.Hooks{})
	if res.Error != "" || res.Stdout != "42\n" {
		t.Fatalf("run after the launcher's death: error %q, stdout %q", res.Error, res.Stdout)
	}
	if st := warmState(p, pythonImage); st != runapi.WarmOK {
		t.Fatalf("warm state %q; want warm still (a killed sandbox is not the image's failure)", st)
	}
	p.waitReady(1)
	if res := p.run(pyTask("print(7)", nil), true); res.Stdout != "7\n" {
		t.Fatalf("next warm run printed %q", res.Stdout)
	}
}

// killLaunchers kills every warm launcher on the host (the test's own:
// the suite runs one test at a time) and says how many.
func killLaunchers(t *testing.T) int {
	t.Helper()
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		// The launcher, not the init above it.
		if err != nil || !strings.Contains(string(b), "\x00"+launcher.WarmPath+"\x00") || strings.HasPrefix(string(b), spec.InitPath+"\x00") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			n++
		}
	}
	return n
}

// TestWarmControlChannelIsClosed: the task's code finds no open end of
// the hand-over channel: the launcher's is closed, and the copy the
// sandbox's init holds leads nowhere (agentrun closed its end first).
// Writing there changes nothing for this run or the next.
func TestWarmControlChannelIsClosed(t *testing.T) {
	p := newWarm(t, pythonImage, 2, nil, pyTask("pass", nil), true)
	code := `import os, stat, glob
print("own", sorted(os.listdir("/proc/self/fd")))
for path in glob.glob("/proc/1/fd/*"):
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        print("open", path, type(e).__name__)
        continue
    if stat.S_ISSOCK(os.fstat(fd).st_mode):
        for msg in (b"ready\n", b"go\n", b"ok\n", b"fail x\n"):
            try:
                os.write(fd, msg)
                print("wrote", path)
            except OSError as e:
                print("write", path, e.errno)
        try:
            print("read", path, os.read(fd, 100))
        except OSError as e:
            print("read", path, e.errno)
    os.close(fd)
print("done")`
	res := p.run(pyTask(code, nil), true)
	if res.ExitCode != 0 || !strings.HasSuffix(res.Stdout, "done\n") || !strings.Contains(res.Stdout, "own ['0', '1', '2', '3']") {
		t.Fatalf("exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if strings.Contains(res.Stdout, "wrote") {
		t.Fatalf("a write to the channel went through: %q", res.Stdout)
	}
	t.Logf("the program's view: %s", res.Stdout)
	p.waitReady(2)
	if res := p.run(pyTask("print(7)", nil), true); res.Stdout != "7\n" || res.ExitCode != 0 {
		t.Fatalf("next warm run: exit %d, stdout %q", res.ExitCode, res.Stdout)
	}
}

// fakePython is an image's python3 that misuses the hand-over channel as
// its preload argument says; run cold, it prints its code file (its last
// argument, after agentrun's run launcher).
const fakePython = `#!/bin/sh
if [ "$2" != ` + launcher.WarmPath + ` ]; then for f; do :; done; cat "$f"; exit 0; fi
fd=$3
case $4 in
close) eval "exec $fd>&-"; exit 0 ;;
junk) eval "printf 'junk\n' >&$fd"; sleep 100 ;;
bad_ok)
	eval "printf 'ready\n' >&$fd"
	eval "read -r line <&$fd"
	eval "printf 'nope\n' >&$fd"
	sleep 100 ;;
late_write)
	trap '' PIPE
	eval "printf 'ready\n' >&$fd"
	eval "read -r line <&$fd"
	eval "printf 'ok\n' >&$fd"
	eval "cat <&$fd >/dev/null"
	eval "printf 'ready\nfail x\n' >&$fd" 2>/dev/null
	echo "wrote after the close: $?"
	cat "$5" ;;
esac
`

// TestWarmHostileInterpreter: an image whose interpreter closes the
// channel, answers junk, refuses the hand-over or writes after it never
// fails a run: the first two make the image's pool plain, a refused
// hand-over runs the task cold, and a write after the hand-over reaches
// no one.
func TestWarmHostileInterpreter(t *testing.T) {
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", filepath.Join(*imagesDir, "busybox", "rootfs"), rootfs).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "python3"), []byte(fakePython), 0o755); err != nil {
		t.Fatal(err)
	}
	ref := "dir:" + rootfs
	seed := pyTask("pass", map[string]any{"image": ref})
	for _, tc := range []struct {
		mode, state, stdout string
		hit                 bool
	}{
		{"close", "closed its end", "print(1)", true},
		{"junk", `said "junk"`, "print(1)", true},
		{"bad_ok", runapi.WarmOK, "print(1)", false},
		{"late_write", runapi.WarmOK, "wrote after the close: 1\nprint(1)", true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			p := newWarm(t, ref, 1, []string{tc.mode}, seed, false)
			deadline := time.Now().Add(60 * time.Second)
			for p.pool.Stats().Ready[ref] < 1 {
				if time.Now().After(deadline) {
					t.Fatalf("no sandbox ready: %+v", p.pool.Stats())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if st := warmState(p, ref); !strings.Contains(st, tc.state) {
				t.Fatalf("warm state %q; want %q", st, tc.state)
			}
			res := p.run(pyTask("print(1)", map[string]any{"image": ref}), tc.hit)
			if res.ExitCode != 0 || res.Stdout != tc.stdout {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %q", res.ExitCode, res.Stdout, res.Stderr, tc.stdout)
			}
		})

	}
}
