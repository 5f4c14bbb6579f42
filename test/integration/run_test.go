package integration

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/result"
)

// The article's five.

func TestSumPrints45(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		res := runIn(t, rt, pyTask("print(sum(range(10)))", nil))
		if res.Stdout != "45\n" || res.ExitCode != 0 || res.ExitStatus() != 0 {
			t.Fatalf("stdout %q exit %d; want \"45\\n\" exit 0 (stderr %q)", res.Stdout, res.ExitCode, res.Stderr)
		}
		if res.DurationMS <= 0 || res.CPUMS < 0 || res.MemoryPeakBytes <= 0 || res.ID == "" {
			t.Errorf("usage not reported: %+v", res)
		}
	})
}

func TestHTTPRequestFails(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := `
import urllib.request, sys
try:
    urllib.request.urlopen("http://198.18.0.1/", timeout=3)
except Exception as e:
    print("blocked:", repr(e), file=sys.stderr)
    sys.exit(3)
print("reached the network")
`
		res := runIn(t, rt, pyTask(code, nil))
		if res.ExitCode != 3 || !strings.Contains(res.Stderr, "blocked:") || strings.Contains(res.Stdout, "reached") {
			t.Fatalf("exit %d stdout %q stderr %q; want the request to fail", res.ExitCode, res.Stdout, res.Stderr)
		}
		if !strings.Contains(res.Stderr, "unreachable") {
			t.Errorf("stderr %q; want a network-unreachable error", res.Stderr)
		}
	})
}

func TestWriteToRootFails(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := `
import errno
try:
    open("/hacked.txt", "w").write("x")
    print("wrote")
except OSError as e:
    print(errno.errorcode[e.errno])
open("/tmp/ok.txt", "w").write("x")  # positive control: /tmp is writable
print("tmp ok")
`
		res := runIn(t, rt, pyTask(code, nil))
		// gVisor checks the directory's permission before the read-only
		// mount: EACCES where Linux says EROFS.
		want := map[string]string{"libcontainer": "EROFS\ntmp ok\n", "runsc": "EACCES\ntmp ok\n"}[rt]
		if res.Stdout != want {
			t.Fatalf("stdout %q stderr %q; want %q", res.Stdout, res.Stderr, want)
		}
	})
}

func TestInfiniteLoopTimesOut(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		start := time.Now()
		res := runIn(t, rt, pyTask("while True: pass", map[string]any{"limits": map[string]any{"timeout": "1s"}}))
		if !res.TimedOut || res.ExitStatus() != result.ExitTimeout {
			t.Fatalf("timed_out %v exit status %d; want true, 124", res.TimedOut, res.ExitStatus())
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("a 1s timeout took %v", el)
		}
	})
}

func TestOutputIsCapped(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		res := runIn(t, rt, pyTask("print('a'*100_000)\nimport sys\nprint('e'*5000, file=sys.stderr)", map[string]any{"limits": map[string]any{"output_bytes": 1024}}))
		if len(res.Stdout) != 1024 || !res.StdoutTruncated || res.StdoutBytes != 100_001 {
			t.Fatalf("stdout len %d truncated %v bytes %d; want 1024 true 100001", len(res.Stdout), res.StdoutTruncated, res.StdoutBytes)
		}
		if len(res.Stderr) != 1024 || !res.StderrTruncated || res.StderrBytes != 5001 {
			t.Fatalf("stderr len %d truncated %v bytes %d; want 1024 true 5001", len(res.Stderr), res.StderrTruncated, res.StderrBytes)
		}
		if res.ExitCode != 0 {
			t.Errorf("exit %d; want 0", res.ExitCode)
		}
	})
}

func TestOutputFloodIsDrained(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		// 64 MiB through a 1 KiB cap: the program must not block on a full pipe.
		res := runIn(t, rt, pyTask("import sys\nb=b'x'*(1<<20)\nfor _ in range(64): sys.stdout.buffer.write(b)\nprint('done', file=sys.stderr)",
			map[string]any{"limits": map[string]any{"output_bytes": 1024, "timeout": "20s"}}))
		if res.TimedOut || res.StdoutBytes != 64<<20 || len(res.Stdout) != 1024 || res.Stderr != "done\n" {
			t.Fatalf("timed_out %v stdout_bytes %d kept %d stderr %q", res.TimedOut, res.StdoutBytes, len(res.Stdout), res.Stderr)
		}
	})
}

// Resources.

func TestForkBombHitsPidsLimit(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := `
import os, errno, time
n = 0
err = ""
while True:
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n, err)
`
		res := runIn(t, rt, pyTask(code, map[string]any{"limits": map[string]any{"pids": 16, "timeout": "20s"}}))
		fields := strings.Fields(res.Stdout)
		if len(fields) != 2 || fields[1] != "EAGAIN" {
			t.Fatalf("stdout %q stderr %q exit %d oom %v; want a count and EAGAIN", res.Stdout, res.Stderr, res.ExitCode, res.OOMKilled)
		}
		if n, _ := strconv.Atoi(fields[0]); n < 1 || n >= 16 {
			t.Errorf("forked %d children under a pids limit of 16", n)
		}
		// The host is fine: this process can still fork and run a container.
		if r := runIn(t, rt, pyTask("print('alive')", nil)); r.Stdout != "alive\n" {
			t.Errorf("run after fork bomb: %q", r.Stdout)
		}
	})
}

func TestMemoryHogIsOOMKilled(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := "x = []\nwhile True: x.append(bytearray(1<<20))"
		res := runIn(t, rt, pyTask(code, map[string]any{"limits": map[string]any{"memory": "64m", "timeout": "30s"}}))
		if !res.OOMKilled || res.ExitStatus() != result.ExitKilled || res.ExitCode != 137 || res.Signal != "SIGKILL" {
			t.Fatalf("oom_killed %v exit %d signal %q status %d; want true 137 SIGKILL 137", res.OOMKilled, res.ExitCode, res.Signal, res.ExitStatus())
		}
		if res.MemoryPeakBytes < 32<<20 || res.MemoryPeakBytes > 72<<20 {
			t.Errorf("memory_peak_bytes %d; want about 64 MiB", res.MemoryPeakBytes)
		}
	})
}

func TestTmpFullGivesENOSPC(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := `
import errno
written = 0
try:
    with open("/tmp/fill", "wb") as f:
        while True:
            f.write(b"x" * 65536)
            f.flush()
            written += 65536
except OSError as e:
    print(errno.errorcode[e.errno], written)
`
		res := runIn(t, rt, pyTask(code, map[string]any{"limits": map[string]any{"tmp_size": "4m"}}))
		fields := strings.Fields(res.Stdout)
		if len(fields) != 2 || fields[0] != "ENOSPC" {
			t.Fatalf("stdout %q stderr %q; want ENOSPC", res.Stdout, res.Stderr)
		}
		if n, _ := strconv.Atoi(fields[1]); n > 4<<20 || n < 3<<20 {
			t.Errorf("wrote %d bytes into a 4 MiB /tmp", n)
		}
	})
}

// Privileges and syscalls.

func TestProcessHasNoPrivilege(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		res := runIn(t, rt, pyTask("print(open('/proc/self/status').read())", nil))
		want := map[string]string{
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
			"NoNewPrivs": "1", "Seccomp": "2",
		}
		got := map[string]string{}
		for _, line := range strings.Split(res.Stdout, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				got[k] = strings.TrimSpace(v)
			}
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("/proc/self/status %s = %q; want %q", k, got[k], v)
			}
		}
		if got["Groups"] != "" {
			t.Errorf("Groups = %q; want none", got["Groups"])
		}
		// The four uids and gids: one id, the run's own of run_uids.
		uid, _, _ := strings.Cut(got["Uid"], "\t")
		four := strings.Repeat(uid+"\t", 3) + uid
		if n, err := strconv.ParseInt(uid, 10, 64); err != nil || !scope.HasUID(n) || got["Uid"] != four || got["Gid"] != four {
			t.Errorf("/proc/self/status Uid %q Gid %q; want one id of run_uids eight times", got["Uid"], got["Gid"])
		}
	})
}

func TestDangerousSyscallsFail(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		// Raw syscall numbers (x86_64) so libc cannot hide the result; getpid is
		// the positive control that proves the probe itself works.
		code := `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def probe(name, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print(name, "ok" if r >= 0 else os.strerror(e).replace(" ", "_"))
probe("getpid", 39)
probe("unshare", 272, 0x10000000)       # CLONE_NEWUSER
probe("unshare_net", 272, 0x40000000)   # CLONE_NEWNET
probe("setns", 308, 0, 0)
probe("mount", 165, 0, 0, 0, 0, 0)
probe("keyctl", 250, 0, 0, 0, 0, 0)
probe("add_key", 248, 0, 0, 0, 0, 0)
probe("ptrace", 101, 16, 1, 0, 0)       # PTRACE_ATTACH to pid 1
probe("process_vm_readv", 310, 1, 0, 0, 0, 0, 0)
probe("io_uring_setup", 425, 1, 0)
probe("userfaultfd", 323, 0)
probe("bpf", 321, 0, 0, 0)
probe("perf_event_open", 298, 0, 0, 0, 0, 0)
probe("clone3", 435, 0, 0)
probe("personality", 135, 0x0400000)    # READ_IMPLIES_EXEC
# Another ABI in a child: the filter admits only the native one, and its
# bad-arch action kills the calling thread.
import subprocess, sys
c = subprocess.run([sys.executable, "-c", "import ctypes; print('ok' if ctypes.CDLL(None).syscall(0x40000000 | 39) >= 0 else 'refused')"], capture_output=True, text=True)
print("x32_getpid", "ok" if c.stdout.strip() == "ok" else ("SIGSYS" if c.returncode == -31 else "failed_%d" % c.returncode))
`
		res := runIn(t, rt, pyTask(code, nil))
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok {
				got[k] = v
			}
		}
		if got["getpid"] != "ok" {
			t.Fatalf("positive control getpid = %q (stdout %q stderr %q)", got["getpid"], res.Stdout, res.Stderr)
		}
		for _, name := range []string{"unshare", "unshare_net", "setns", "mount", "keyctl", "add_key", "ptrace", "process_vm_readv",
			"io_uring_setup", "userfaultfd", "bpf", "perf_event_open", "clone3", "personality", "x32_getpid"} {
			v, ok := got[name]
			if !ok || v == "ok" {
				t.Errorf("%s = %q; want it to fail", name, v)
			}
		}
		if got["unshare"] != "Operation_not_permitted" || got["ptrace"] != "Operation_not_permitted" {
			t.Errorf("unshare %q ptrace %q; want EPERM from seccomp", got["unshare"], got["ptrace"])
		}
	})
}

// Isolation.

func TestEnvironmentHoldsOnlyTaskEnv(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		os.Setenv("AGENTRUN_TEST_CANARY", "secret-canary")
		defer os.Unsetenv("AGENTRUN_TEST_CANARY")
		res := runIn(t, rt, `{"command": ["/usr/bin/env"], "env": {"FOO": "bar"}}`)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		want := map[string]bool{"FOO=bar": true, "HOME=/tmp": true, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin": true}
		if len(lines) != len(want) {
			t.Errorf("env has %d variables; want %d: %q", len(lines), len(want), lines)
		}
		for _, l := range lines {
			if !want[l] {
				t.Errorf("unexpected variable %q", l)
			}
		}
		if strings.Contains(res.Stdout, "secret-canary") {
			t.Error("agentrun's own environment leaked into the sandbox")
		}
	})
}

func TestNoHostFileOrProcessVisible(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		canary := filepath.Join("/tmp", fmt.Sprintf("agentrun-canary-%d", os.Getpid()))
		if err := os.WriteFile(canary, []byte("host secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(canary)
		code := fmt.Sprintf(`
import os
print(os.path.exists(%q), os.path.exists("/etc/agentrun"), os.path.exists("/run/agentrun"))
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == [1, os.getpid()] and os.getppid() == 1)
print(os.path.exists("/proc/%d"))
print(open("/proc/1/cmdline").read().split("\0")[0])
mounts = open("/proc/self/mountinfo").read()
print("agentrun-test" in mounts or %q in mounts)
`, canary, os.Getpid(), stateDir)
		res := runIn(t, rt, pyTask(code, nil))
		lines := strings.Split(res.Stdout, "\n")
		if len(lines) < 5 {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
		if lines[0] != "False False False" {
			t.Errorf("host paths visible: %q", lines[0])
		}
		if lines[1] != "True" {
			t.Errorf("processes visible other than the init (1) and the program, its child: %s", lines[1])
		}
		if lines[2] != "False" {
			t.Errorf("the test's own pid is visible")
		}
		if lines[3] != "/dev/init" {
			t.Errorf("pid 1 is %q; want the sandbox's init", lines[3])
		}
		if lines[4] != "False" {
			t.Errorf("host state paths appear in mountinfo")
		}
	})
}

func TestOnlyStdioFdsOpen(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := `
import os
open_fds = []
for fd in range(3, 4096):
    try:
        os.fstat(fd)
        open_fds.append((fd, os.readlink("/proc/self/fd/%d" % fd)))
    except OSError:
        pass
print(open_fds)
print([os.fstat(fd).st_mode != 0 for fd in (0, 1, 2)])
`
		res := runIn(t, rt, pyTask(code, nil))
		if res.Stdout != "[]\n[True, True, True]\n" {
			t.Fatalf("stdout %q stderr %q; want no fd above 2", res.Stdout, res.Stderr)
		}
	})
}

func TestStdinIsFed(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		res := runIn(t, rt, pyTask("import sys\nprint(sys.stdin.read().upper())", map[string]any{"stdin": "hello"}))
		if res.Stdout != "HELLO\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
	})
}

func TestFilesAndCollect(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		code := `
import os
data = open("/workspace/in/data.csv").read()
os.makedirs("/workspace/out", exist_ok=True)
open("/workspace/out/result.txt", "w").write(data.upper())
os.symlink("/etc/passwd", "/workspace/out/passwd.txt")
os.symlink("/etc", "/workspace/etc")
print(open("/workspace/blob.bin", "rb").read())
`
		res := runIn(t, rt, pyTask(code, map[string]any{
			"files":   map[string]any{"in/data.csv": map[string]string{"content": "a,b\n"}, "blob.bin": map[string]string{"content_base64": "AAEC"}},
			"collect": []string{"out/*.txt", "etc/passwd"},
		}))
		if res.Stdout != "b'\\x00\\x01\\x02'\n" {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
		f, ok := res.Files["out/result.txt"]
		if !ok || f.ContentBase64 != base64.StdEncoding.EncodeToString([]byte("A,B\n")) {
			t.Errorf("out/result.txt = %+v", f)
		}
		if f := res.Files["out/passwd.txt"]; f.Error == "" || f.ContentBase64 != "" {
			t.Errorf("symlink out of the workspace was followed: %+v", f)
		}
		if _, ok := res.Files["etc/passwd"]; ok {
			t.Errorf("collect followed a directory symlink out of the workspace")
		}
	})
}

func TestSetsidDoubleForkDiesAtTimeout(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		marker := fmt.Sprintf("agentrun-orphan-%d", time.Now().UnixNano())
		code := fmt.Sprintf(`
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(1000)", %q])
    os._exit(0)
time.sleep(1000)
`, marker)
		res := runIn(t, rt, pyTask(code, map[string]any{"limits": map[string]any{"timeout": "1s"}}))
		if !res.TimedOut {
			t.Fatalf("timed_out false: %+v", res)
		}
		if pids := hostPidsWith(marker); len(pids) > 0 {
			t.Errorf("double-forked child survived the run: host pids %v", pids)
		}
	})
}

// hostPidsWith lists host processes whose command line contains s.
func hostPidsWith(s string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), s) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func TestConcurrentRunsAreIsolated(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		const n = 10
		code := `
import os, sys, time
me = sys.argv[0]
open("/tmp/mark", "w").write(os.environ["RUN"])
open("/workspace/mark", "w").write(os.environ["RUN"])
time.sleep(0.5)
print(os.environ["RUN"], open("/tmp/mark").read(), open("/workspace/mark").read(), sorted(os.listdir("/tmp")), len([p for p in os.listdir("/proc") if p.isdigit()]))
`
		var wg sync.WaitGroup
		results := make([]*result.Result, n)
		for i := range n {
			wg.Go(func() {
				results[i] = runOnly(t, cfgFor(t, rt), nil, pyTask(code, map[string]any{"env": map[string]string{"RUN": strconv.Itoa(i)}, "limits": map[string]any{"timeout": "30s"}}))
			})
		}
		wg.Wait()
		assertNoLeaks(t)
		for i, res := range results {
			want := fmt.Sprintf("%d %d %d ['mark'] 2\n", i, i, i) // the init and the program
			if res.Error != "" || res.Stdout != want {
				t.Errorf("run %d: stdout %q; want %q (stderr %q, error %q)", i, res.Stdout, want, res.Stderr, res.Error)
			}
		}
	})
}

// A program that cannot be started is a setup failure: an error, exit
// status 125, and everything set up for it rolled back.
func TestMissingProgramRollsBack(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := cfgFor(t, rt)
		res := runOnly(t, cfg, nil, `{"command": ["/nonexistent/program"]}`)
		if res.Error == "" || res.ExitStatus() != result.ExitSetup {
			t.Errorf("error %q exit status %d; want a setup error and 125", res.Error, res.ExitStatus())
		}
		if !strings.Contains(res.Error, "/nonexistent/program") {
			t.Errorf("error %q does not name the program", res.Error)
		}
		assertNoLeaks(t)
	})
}

// TestRunscIsGVisor proves a runsc run is served by gVisor's kernel, not
// the host's: another kernel release, and gVisor's /proc/version.
func TestRunscIsGVisor(t *testing.T) {
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	code := "import platform\nprint(platform.release())\nprint(open('/proc/version').read().strip())"
	lc := runIn(t, "libcontainer", pyTask(code, nil))
	sc := runIn(t, "runsc", pyTask(code, nil))
	hostRelease := unix.ByteSliceToString(host.Release[:])
	if first := strings.SplitN(lc.Stdout, "\n", 2)[0]; first != hostRelease {
		t.Errorf("libcontainer release %q; want the host's %q", first, hostRelease)
	}
	lines := strings.SplitN(sc.Stdout, "\n", 3)
	if len(lines) < 2 || lines[0] == hostRelease || !strings.Contains(lines[0], "gvisor") || !strings.Contains(strings.ToLower(lines[1]), "gvisor") {
		t.Errorf("runsc run reports release %q and /proc/version %q; want gVisor's, not the host's %q", lines[0], lines[1:], hostRelease)
	}
	if sc.Runtime != "runsc" || lc.Runtime != "libcontainer" {
		t.Errorf("result runtimes %q and %q", lc.Runtime, sc.Runtime)
	}
}

// A program whose main thread ends while another thread spins (its process
// leader is a zombie) is still killed at the timeout.
func TestTimeoutKillsProgramWithoutMainThread(t *testing.T) {
	code := `
import ctypes, threading
def spin():
    while True: pass
threading.Thread(target=spin).start()
ctypes.CDLL(None).pthread_exit(None)
`
	eachRuntime(t, func(t *testing.T, rt string) {
		start := time.Now()
		res := runIn(t, rt, pyTask(code, map[string]any{"limits": map[string]any{"timeout": "1s"}}))
		if !res.TimedOut || res.ExitStatus() != result.ExitTimeout {
			t.Errorf("timed_out %v exit status %d; want true, 124", res.TimedOut, res.ExitStatus())
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("a 1s timeout took %v", el)
		}
	})
}
