package integration

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/result"
)

// initCases are programs that met pid 1's semantics before the sandbox
// had an init: abort() read as SIGSEGV (139), a program's SIGTERM to
// itself was ignored, and orphans stayed zombies against the pids cap.
var initCases = []struct {
	name, code string
	check      func(t *testing.T, res *result.Result)
}{
	{"abort", "import os\nos.abort()", func(t *testing.T, res *result.Result) {
		if res.ExitCode != 134 || res.Signal != "SIGABRT" || res.ExitStatus() != 134 {
			t.Errorf("os.abort(): exit %d signal %q; want 134 SIGABRT", res.ExitCode, res.Signal)
		}
	}},
	{"self-sigterm", "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(3)\nprint('survived')", func(t *testing.T, res *result.Result) {
		if res.ExitCode != 143 || res.Signal != "SIGTERM" || res.Stdout != "" || res.TimedOut {
			t.Errorf("self-SIGTERM: exit %d signal %q stdout %q; want 143 SIGTERM and nothing printed", res.ExitCode, res.Signal, res.Stdout)
		}
	}},
	{"orphans-reaped", `
import os, time
for i in range(8):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            time.sleep(0.05)
            os._exit(0)     # an orphan by now: its parent is gone
        os._exit(0)
    os.waitpid(pid, 0)
time.sleep(0.5)
zombies = 0
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()[0] == "Z":
                zombies += 1
        except OSError:
            pass
comm = open("/proc/1/comm").read().strip()
try:
    open("/dev/init", "r+b")
    writable = "writable"
except OSError as e:
    writable = e.__class__.__name__
print(zombies, comm, writable, os.statvfs("/dev/init").f_flag & os.ST_RDONLY)
`, func(t *testing.T, res *result.Result) {
		// 8 orphans, none left a zombie; pid 1 is the init, read-only
		// and not writable by the program.
		if got := strings.Fields(res.Stdout); len(got) != 4 || got[0] != "0" || got[1] != "init" || got[2] == "writable" || got[3] != "1" {
			t.Errorf("zombies, pid 1, /dev/init writable, read-only mount = %q (stderr %q); want 0 init <error> 1", res.Stdout, res.Stderr)
		}
		if res.ExitCode != 0 {
			t.Errorf("exit %d signal %q timed out %v after %d ms", res.ExitCode, res.Signal, res.TimedOut, res.DurationMS)
		}
	}},
}

// initLimits give forks under gVisor time enough.
var initLimits = map[string]any{"limits": map[string]any{"timeout": "20s"}}

// TestInitGivesProgramSignalsAndReapsOrphans runs each case on both
// runtimes, cold.
func TestInitGivesProgramSignalsAndReapsOrphans(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		for _, c := range initCases {
			t.Run(c.name, func(t *testing.T) {
				res := runIn(t, rt, pyTask(c.code, initLimits))
				if res.Error != "" {
					t.Fatalf("run failed: %s", res.Error)
				}
				c.check(t, res)
			})
		}
	})
}

// TestPoolInit runs each case in a sandbox from the warm pool.
func TestPoolInit(t *testing.T) {
	p := newPooled(t, 1, pyTask("print(1)", initLimits))
	for _, c := range initCases {
		t.Run(c.name, func(t *testing.T) {
			p.waitReady(1)
			c.check(t, p.run(pyTask(c.code, initLimits), true))
		})
	}
}
