package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// sessionCfg is the test config on runtime rt with sessions of maxBytes
// kept in the suite's store.
func sessionCfg(t testing.TB, rt, maxBytes string) *config.Config {
	cfg := cfgFor(t, rt)
	cfg.Sessions.MaxBytes = config.MustSize(maxBytes)
	return cfg
}

// newSession makes a session with cfg's store and removes it when the
// test ends.
func newSession(t testing.TB, cfg *config.Config) (*runner.Runner, string) {
	t.Helper()
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := r.Sessions().Create()
	if err != nil {
		t.Fatalf("creating session: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Sessions().Remove(id); err != nil && !errors.Is(err, session.ErrNotFound) {
			t.Errorf("removing session: %v", err)
		}
	})
	return r, id
}

// runSession runs python code in session id with extra task fields.
func runSession(t testing.TB, r *runner.Runner, cfg *config.Config, id, code string, extra map[string]any) *result.Result {
	t.Helper()
	m := map[string]any{"session": id, "keep_workspace": true}
	for k, v := range extra {
		m[k] = v
	}
	plan, err := task.Load([]byte(pyTask(code, m)), cfg)
	if err != nil {
		t.Fatalf("task.Load: %v", err)
	}
	return r.Run(context.Background(), plan, runapi.Hooks{})
}

func mustOK(t testing.TB, res *result.Result) {
	t.Helper()
	if res.Error != "" || res.ExitCode != 0 {
		t.Fatalf("run failed: exit %d, error %q, stderr %s", res.ExitCode, res.Error, res.Stderr)
	}
}

// TestSessionCarriesFilesOnly: files written in run 1 are read in run 2;
// /tmp, processes and environment do not carry over; another session sees
// none of it.
func TestSessionCarriesFilesOnly(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := sessionCfg(t, rt, "64m")
		r, id := newSession(t, cfg)
		_, other := newSession(t, cfg)

		res := runSession(t, r, cfg, id, `
import os, subprocess
os.makedirs("/workspace/sub", exist_ok=True)
open("/workspace/sub/kept.txt", "w").write("from run 1")
open("/tmp/scratch", "w").write("x")
subprocess.Popen(["sleep", "300"], start_new_session=True)
print(os.environ.get("RUN1_ONLY"))`, map[string]any{"env": map[string]string{"RUN1_ONLY": "yes"}})
		mustOK(t, res)
		assertNoLeaks(t)

		res = runSession(t, r, cfg, id, `
import os
print(open("/workspace/sub/kept.txt").read())
print("tmp:", os.listdir("/tmp"))
print("env:", os.environ.get("RUN1_ONLY"))
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("procs:", sorted(open("/proc/%s/comm" % p).read().strip() for p in pids))`, nil)
		mustOK(t, res)
		// Only the sandbox's init (tini, comm "init") and this program: run
		// 1's sleep is gone.
		want := "from run 1\ntmp: []\nenv: None\nprocs: ['init', 'python3']\n"
		if res.Stdout != want {
			t.Errorf("run 2 saw:\n%s\nwant:\n%s", res.Stdout, want)
		}

		res = runSession(t, r, cfg, other, `import os; print(sorted(os.listdir("/workspace")))`, nil)
		mustOK(t, res)
		if res.Stdout != "['main.py']\n" {
			t.Errorf("another session sees: %s", res.Stdout)
		}
		assertNoLeaks(t)
	})
}

// TestSessionRefusesUnknownIDs: keep_workspace on an id never made, a
// removed one or a malformed one is refused, and makes nothing.
func TestSessionRefusesUnknownIDs(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "32m")
	r, id := newSession(t, cfg)
	if err := r.Sessions().Remove(id); err != nil {
		t.Fatal(err)
	}
	forged := "ss-0123456789abcdef0123456789abcdef"
	for _, bad := range []string{forged, id} {
		res := runSession(t, r, cfg, bad, `print("ran")`, nil)
		if !strings.Contains(res.Error, "no such session") || res.ExitStatus() != result.ExitSetup || res.Stdout != "" {
			t.Errorf("session %s: error %q, exit %d, stdout %q", bad, res.Error, res.ExitStatus(), res.Stdout)
		}
		if _, err := os.Stat(filepath.Join(cfg.StoreDir, "sessions", bad)); err == nil {
			t.Errorf("session %s was made by a run", bad)
		}
	}
	_, err := task.Load([]byte(`{"session":"chat-42","keep_workspace":true,"code":"1"}`), cfg)
	if err == nil || !strings.Contains(err.Error(), "keep_workspace") {
		t.Errorf("malformed id: %v", err)
	}
	assertNoLeaks(t)
}

// TestSessionCap: writing past sessions.max_bytes fails with ENOSPC inside
// the sandbox, and the disk image on the host stays within the cap.
func TestSessionCap(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := sessionCfg(t, rt, "32m")
		r, id := newSession(t, cfg)
		res := runSession(t, r, cfg, id, `
import errno
f = open("/workspace/big", "wb")
try:
    for i in range(64):
        f.write(b"x" * (1 << 20))
        f.flush()
    print("wrote 64 MiB")
except OSError as e:
    print("ENOSPC" if e.errno == errno.ENOSPC else "other: %s" % e)`, map[string]any{"limits": map[string]any{"timeout": "30s"}})
		mustOK(t, res)
		if res.Stdout != "ENOSPC\n" {
			t.Errorf("writing past the cap: %q", res.Stdout)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(cfg.StoreDir, "sessions", id, "disk.img"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != 32<<20 || st.Blocks*512 > 32<<20 {
			t.Errorf("disk image: size %d, %d bytes on the host; cap %d", st.Size, st.Blocks*512, 32<<20)
		}
		assertNoLeaks(t)
	})
}

// TestSessionBusy, on each runtime: a second run while one runs is refused at once with
// "session busy" and exit 125; rm of a busy session is refused; when idle,
// the session runs again and rm removes it.
func TestSessionBusy(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) { sessionBusy(t, sessionCfg(t, rt, "32m")) })
}

func sessionBusy(t *testing.T, cfg *config.Config) {
	r, id := newSession(t, cfg)
	var wg sync.WaitGroup
	var first *result.Result
	firstDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(firstDone)
		first = runSession(t, r, cfg, id, `import time; time.sleep(3); print("first")`, nil)
	}()
	waitBusy(t, r, id)
	second := runSession(t, r, cfg, id, `print("second")`, nil)
	if !strings.Contains(second.Error, "session busy") || second.ExitStatus() != 125 || second.Stdout != "" {
		t.Errorf("second run: error %q, exit %d, stdout %q", second.Error, second.ExitStatus(), second.Stdout)
	}
	// At once: not after waiting for the first run to end.
	select {
	case <-firstDone:
		t.Errorf("the refusal came only after the first run ended")
	default:
	}
	if err := r.Sessions().Remove(id); !errors.Is(err, session.ErrBusy) {
		t.Errorf("rm of a busy session: %v", err)
	}
	if _, err := r.Sessions().Files(id); !errors.Is(err, session.ErrBusy) {
		t.Errorf("files of a busy session: %v", err)
	}
	wg.Wait()
	mustOK(t, first)
	mustOK(t, runSession(t, r, cfg, id, `print("again")`, nil))
	if err := r.Sessions().Remove(id); err != nil {
		t.Errorf("rm while idle: %v", err)
	}
	if _, err := r.Sessions().Get(id); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("after rm: %v", err)
	}
	assertNoLeaks(t)
}

func waitBusy(t *testing.T, r *runner.Runner, id string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if in, err := r.Sessions().Get(id); err == nil && in.Busy {
			return
		}
	}
	t.Fatal("session never became busy")
}

// TestSessionTTL: gc removes a session idle past sessions.ttl, never one in
// use, and not one used recently.
func TestSessionTTL(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "32m")
	cfg.Sessions.TTL = config.MustDuration("1h")
	r, idle := newSession(t, cfg)
	_, busy := newSession(t, cfg)
	_, fresh := newSession(t, cfg)
	old := time.Now().Add(-2 * time.Hour)
	for _, id := range []string{idle, busy} {
		if err := os.Chtimes(filepath.Join(cfg.StoreDir, "sessions", id, "lock"), old, old); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := r.Sessions().Lock(busy)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := r.GC()
	lease.Release()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(removed, ",") != idle {
		t.Errorf("gc removed %v, want only %s", removed, idle)
	}
	for id, want := range map[string]bool{idle: false, busy: true, fresh: true} {
		if _, err := r.Sessions().Get(id); (err == nil) != want {
			t.Errorf("session %s after gc: %v, want kept=%v", id, err, want)
		}
	}
	assertNoLeaks(t)
}

// TestSessionHostileLeftovers: a program leaves symlinks to /etc/shadow
// and /proc/1/root (one of them as main.py), a fifo, 100000 empty files
// and a name with a newline; it cannot make a 10 GB file (RLIMIT_FSIZE
// refuses a write past the session's size), so its sparse file is as
// large as that allows. Listing, reading, writing and collecting stay
// inside the session, stop at their bounds and say so, never read the
// sparse file whole, and do not hang; the next run still works.
func TestSessionHostileLeftovers(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		// 512m: 131072 inodes (one per 4 KiB), room for 100000 files.
		cfg := sessionCfg(t, rt, "512m")
		r, id := newSession(t, cfg)
		shadow, err := os.ReadFile("/etc/shadow")
		if err != nil {
			t.Fatal(err)
		}
		res := runSession(t, r, cfg, id, `
import errno, os, resource
os.chdir("/workspace")
os.symlink("/etc/shadow", "shadow")
os.symlink("/proc/1/root", "proc1")
os.mkfifo("fifo")
limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
fd = os.open("sparse", os.O_WRONLY | os.O_CREAT, 0o644)
for what, off in (("10 GB", 10 << 30), ("past the limit", limit)):
    try:
        os.pwrite(fd, b"x", off)
        print(what + ": written")
    except OSError as e:
        print(what + ":", errno.errorcode[e.errno])
# As large as allowed: one byte at the end, the rest a hole.
os.pwrite(fd, b"x", limit - 1)
os.close(fd)
st = os.stat("sparse")
print("sparse:", st.st_size == limit)
os.mkdir("many")
for i in range(50000):
    os.close(os.open("many/%d" % i, os.O_WRONLY | os.O_CREAT, 0o644))
open("new\nline.txt", "w").write("nl")
print(limit)`, map[string]any{"limits": map[string]any{"timeout": "60s"}})
		mustOK(t, res)
		head, limitLine, _ := strings.Cut(strings.TrimSuffix(res.Stdout, "\n"), "sparse: True\n")
		if head != "10 GB: EFBIG\npast the limit: EFBIG\n" {
			t.Fatalf("making the leftovers: %q", res.Stdout)
		}
		// The other half of the small files in a run of its own, each well
		// within the timeout on a loaded host under runsc too.
		res = runSession(t, r, cfg, id, `
import os
for i in range(50000, 100000):
    os.close(os.open("/workspace/many/%d" % i, os.O_WRONLY | os.O_CREAT, 0o644))
print(len(os.listdir("/workspace/many")))
os.remove("/workspace/main.py")
os.symlink("/etc/shadow", "/workspace/main.py")`, map[string]any{"limits": map[string]any{"timeout": "60s"}})
		mustOK(t, res)
		if res.Stdout != "100000\n" {
			t.Fatalf("making 100000 files: %q", res.Stdout)
		}
		limit, err := strconv.ParseInt(limitLine, 10, 64)
		if err != nil || limit < 512<<20 {
			t.Fatalf("RLIMIT_FSIZE in the sandbox: %q", limitLine)
		}
		st := r.Sessions()
		// On the host the sparse file is a hole: the session's image takes
		// its inode tables, directories and journal, not the file's size.
		if in, err := st.Get(id); err != nil || in.DiskBytes > 96<<20 {
			t.Errorf("the session's image takes %+v on the host (%v)", in, err)
		}

		start := time.Now()
		l, err := st.Files(id)
		if err != nil {
			t.Fatalf("files: %v", err)
		}
		if !l.Truncated || len(l.Files) != session.MaxList {
			t.Errorf("listing: %d entries, truncated %v; want %d, cut", len(l.Files), l.Truncated, session.MaxList)
		}
		byName := map[string]session.File{}
		for _, f := range l.Files {
			byName[f.Name] = f
		}
		wantFifo := "fifo"
		if rt == "runsc" {
			// gVisor keeps a fifo made in a gofer mount inside the
			// sandbox: the host never sees it.
			wantFifo = ""
		}
		for name, want := range map[string]string{"shadow": "symlink", "proc1": "symlink", "fifo": wantFifo, "sparse": "file",
			"new\nline.txt": "file", "main.py": "symlink", "many": "dir"} {
			if byName[name].Type != want {
				t.Errorf("listing: %q is %q, want %q", name, byName[name].Type, want)
			}
		}
		if byName["sparse"].Size != limit {
			t.Errorf("listing: the sparse file is %d bytes, want %d", byName["sparse"].Size, limit)
		}

		for name, want := range map[string]error{"shadow": session.ErrBadPath, "main.py": session.ErrBadPath, "proc1/etc/hostname": session.ErrBadPath,
			"fifo": session.ErrBadPath, "../etc/passwd": session.ErrBadPath, "many": session.ErrBadPath} {
			data, err := st.ReadFile(id, name)
			if !errors.Is(err, want) || data != nil {
				t.Errorf("read %q: %d bytes, %v; want %v", name, len(data), err, want)
			}
		}
		// The sparse file is refused by its size, before a byte of it is
		// read: this process reads less than a MiB meanwhile.
		before := readChars(t)
		data, err := st.ReadFile(id, "sparse")
		if read := readChars(t) - before; read > 1<<20 {
			t.Errorf("reading the sparse file read %d bytes on the host", read)
		}
		if !errors.Is(err, session.ErrTooLarge) || data != nil || !strings.Contains(err.Error(), strconv.FormatInt(limit, 10)+" bytes") {
			t.Errorf("read of the sparse file: %d bytes, %v", len(data), err)
		}
		if data, err := st.ReadFile(id, "new\nline.txt"); err != nil || string(data) != "nl" {
			t.Errorf("read of a name with a newline: %q, %v", data, err)
		}
		if data, err := st.ReadFile(id, "many/99999"); err != nil || len(data) != 0 {
			t.Errorf("read of the last small file: %q, %v", data, err)
		}

		if err := st.WriteFile(id, "shadow", strings.NewReader("replaced")); err != nil {
			t.Errorf("write over a symlink: %v", err)
		}
		if data, _ := st.ReadFile(id, "shadow"); string(data) != "replaced" {
			t.Errorf("after writing over the symlink: %q", data)
		}
		if err := st.WriteFile(id, "many/uploaded", strings.NewReader("up")); err != nil {
			t.Errorf("write among 100000 files: %v", err)
		}
		if err := st.WriteFile(id, "proc1/tmp/escaped", strings.NewReader("x")); !errors.Is(err, session.ErrBadPath) {
			t.Errorf("write through a symlink out: %v", err)
		}
		if err := st.WriteFile(id, "big", strings.NewReader(strings.Repeat("x", session.MaxFileBytes+1))); !errors.Is(err, session.ErrTooLarge) {
			t.Errorf("write over the bound: %v", err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("host-side accesses took %v", d)
		}

		// The next run rewrites main.py (a symlink to /etc/shadow) and
		// collects from among the leftovers: the walk stops at its bound on
		// matches and says so.
		res = runSession(t, r, cfg, id, `print("next")`, map[string]any{"collect": []string{"*", "many/*"}})
		mustOK(t, res)
		if res.Stdout != "next\n" {
			t.Errorf("next run: %q", res.Stdout)
		}
		if res.Collect == nil || res.Collect.Cut != fmt.Sprintf("%d files", workspace.MaxCollectFiles) || len(res.Files) != workspace.MaxCollectFiles {
			t.Errorf("collect: %d files, report %+v; want cut at %d files", len(res.Files), res.Collect, workspace.MaxCollectFiles)
		}
		for name, wantErr := range map[string]bool{"proc1": true, "fifo": true, "main.py": false, "shadow": false} {
			f, ok := res.Files[name]
			if name == "fifo" && wantFifo == "" {
				if ok {
					t.Errorf("collect: the sandbox's fifo is on the host: %+v", f)
				}
				continue
			}
			if !ok || (f.Error != "") != wantErr {
				t.Errorf("collect %q: %+v (present %v)", name, f, ok)
			}
		}
		if f := res.Files["sparse"]; !f.Truncated {
			t.Errorf("collect of the sparse file: %+v", f)
		}
		if now, _ := os.ReadFile("/etc/shadow"); string(now) != string(shadow) {
			t.Error("/etc/shadow changed")
		}
		if _, err := os.Stat("/tmp/escaped"); err == nil {
			t.Error("a write escaped to the host's /tmp")
		}
		assertNoLeaks(t)
	})
}

// readChars is how many bytes this process has read (rchar of
// /proc/self/io: every read, from disk or not).
func readChars(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no rchar in /proc/self/io: %s", b)
	return 0
}

// TestSessionSIGKILL kills agentrun mid-run in a session, on each
// runtime; after gc the session is unlocked and holds what the run wrote,
// and no loop device, mount, process or run state is left.
func TestSessionSIGKILL(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		bin := agentrunBin(t)
		cfgPath := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir,
			"store_dir": filepath.Join(stateDir, "store"), "audit": "", "sessions": map[string]any{"max_bytes": "32m"},
			"runsc": map[string]any{"path": runscPath, "flags": []string{}}})
		out, err := exec.Command(bin, "sessions", "--config", cfgPath, "new").Output()
		if err != nil {
			t.Fatalf("sessions new: %v", err)
		}
		id := strings.TrimSpace(string(out))
		cfg := sessionCfg(t, rt, "32m")
		st, err := session.Open(cfg, 65534, 65534)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Remove(id)

		victim := exec.Command(bin, "run", "--config", cfgPath, "-")
		victim.Stdin = strings.NewReader(`{"runtime":"` + rt + `","session":"` + id + `","keep_workspace":true,"limits":{"timeout":"60s"},` +
			`"code":"import os, time\nf = open('/workspace/done', 'w')\nf.write('written')\nf.close()\nos.sync()\nopen('/workspace/flag', 'w').close()\ntime.sleep(60)"}`)
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		// The flag shows in the run's mount of the session's disk.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if flags, _ := filepath.Glob(filepath.Join(stateDir, "runs", "*", "workspace", "flag")); len(flags) > 0 {
				break
			}
			if time.Now().After(deadline) {
				victim.Process.Kill()
				victim.Wait()
				t.Fatal("the run never wrote its flag")
			}
		}
		victim.Process.Signal(syscall.SIGKILL)
		victim.Wait()
		if out, err := exec.Command(bin, "gc", "--config", cfgPath).CombinedOutput(); err != nil {
			t.Fatalf("agentrun gc: %v\n%s", err, out)
		}
		assertNoLeaks(t)
		if in, err := st.Get(id); err != nil || in.Busy {
			t.Errorf("after gc: %+v, %v; want the session, free", in, err)
		}
		if data, err := st.ReadFile(id, "done"); err != nil || string(data) != "written" {
			t.Errorf("after the crash: %q, %v", data, err)
		}
		if _, err := exec.Command(bin, "sessions", "--config", cfgPath, "rm", id).CombinedOutput(); err != nil {
			t.Errorf("rm after the crash: %v", err)
		}
		assertNoLeaks(t)
	})
}

// TestSessionInstallThenLock, on each runtime: run 1, allowed to reach the fake internet
// host, downloads a Python module into the session's /workspace; run 2,
// with no network at all, imports it.
func TestSessionInstallThenLock(t *testing.T) {
	in := proxytest.NewInternet(t)
	in.Mux.HandleFunc("/pkg/greet.py", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "def hello():\n    return 'hello from an installed module'\n")
	})
	eachRuntime(t, func(t *testing.T, rt string) { installThenLock(t, in, netConfigFor(t, in, rt)) })
}

func installThenLock(t *testing.T, in *proxytest.Internet, cfg *config.Config) {
	r, id := newSession(t, cfg)
	res := runSession(t, r, cfg, id, fetchPy+`
import os
os.makedirs("/workspace/lib", exist_ok=True)
status, body = fetch("https://internet.test/pkg/greet.py").split(" ", 1)
open("/workspace/lib/greet.py", "w").write(body)
print(status)`, map[string]any{
		"files":   map[string]any{"ca.pem": map[string]string{"content": string(in.CAPEM)}},
		"env":     map[string]string{"SSL_CERT_FILE": "/workspace/ca.pem"},
		"network": map[string]any{"allow": []string{"internet.test"}},
		"limits":  map[string]any{"timeout": "20s"}})
	mustOK(t, res)
	if res.Stdout != "200\n" {
		t.Fatalf("install run: %q %s", res.Stdout, res.Stderr)
	}
	res = runSession(t, r, cfg, id, fetchPy+`
import sys
sys.path.insert(0, "/workspace/lib")
import greet
print(greet.hello())
print(fetch("https://internet.test/hello"))`, nil)
	mustOK(t, res)
	if !strings.HasPrefix(res.Stdout, "hello from an installed module\n") || strings.Contains(res.Stdout, "200") {
		t.Errorf("locked run: %q %s", res.Stdout, res.Stderr)
	}
	assertNoLeaks(t)
}

// TestSessionMax: sessions.max bounds the sessions of the host; one more
// is refused and leaves nothing.
func TestSessionMax(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "16m")
	cfg.Sessions.Max = 2
	// A store of its own: the suite's holds the sessions other tests
	// keep.
	cfg.StoreDir = filepath.Join(t.TempDir(), "store")
	r, _ := newSession(t, cfg)
	newSession(t, cfg)
	if id, err := r.Sessions().Create(); !errors.Is(err, session.ErrFull) {
		t.Errorf("a third session: %q, %v", id, err)
	}
	ents, err := os.ReadDir(filepath.Join(cfg.StoreDir, "sessions"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 3 { // two sessions and the store's lock
		t.Errorf("store holds %v", names)
	}
	assertNoLeaks(t)
}

// TestSessionSIGKILLDuringUpload: agentrun killed while it writes a file
// into a session (its disk mounted on the host) leaves a mount that gc
// removes, with its loop device; the session is usable afterwards.
func TestSessionSIGKILLDuringUpload(t *testing.T) {
	bin := agentrunBin(t)
	cfgPath := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir,
		"store_dir": filepath.Join(stateDir, "store"), "audit": "", "sessions": map[string]any{"max_bytes": "16m"}})
	cfg := sessionCfg(t, "libcontainer", "16m")
	_, id := newSession(t, cfg)
	put := exec.Command(bin, "sessions", "--config", cfgPath, "put", id, "slow.txt")
	stdin, err := put.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("partial"))
	waitSessionBusy(t, id)
	// Busy comes before the mount: wait for it.
	for deadline := time.Now().Add(10 * time.Second); len(hostLeaks()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upload's mount never showed")
		}
	}
	put.Process.Signal(syscall.SIGKILL)
	put.Wait()
	stdin.Close()
	if out, err := exec.Command(bin, "gc", "--config", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("agentrun gc: %v\n%s", err, out)
	}
	assertNoLeaks(t)
	st, err := session.Open(cfg, 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.WriteFile(id, "after.txt", strings.NewReader("ok")); err != nil {
		t.Errorf("after the crash: %v", err)
	}
	assertNoLeaks(t)
}

// TestSessionRunsColdBesidePool: with a warm pool for the same image, a
// run with keep_workspace is never served from it (the pool's sandboxes
// have a tmpfs workspace): it runs cold in the session's disk, the pool's
// ready sandbox is left for others, and the next run sees the files.
func TestSessionRunsColdBesidePool(t *testing.T) {
	p := newPooled(t, 1, pyTask("pass", nil))
	id, err := p.r.Sessions().Create()
	if err != nil {
		t.Fatal(err)
	}
	defer p.r.Sessions().Remove(id)
	kept := func(code string) string {
		return pyTask(code, map[string]any{"session": id, "keep_workspace": true})
	}
	p.run(kept(`open("/workspace/kept.txt", "w").write("kept")`), false)
	if res := p.run(kept(`print(open("/workspace/kept.txt").read())`), false); res.Stdout != "kept\n" {
		t.Errorf("second session run: %q", res.Stdout)
	}
	if st := p.pool.Stats(); st.Ready[pythonImage] != 1 {
		t.Errorf("the pool after session runs: %+v", st)
	}
	// The pool still serves a plain run.
	if res := p.run(pyTask(`import os; print(os.listdir("/workspace"))`, nil), true); res.Stdout != "['main.py']\n" {
		t.Errorf("pooled run after the session runs: %q", res.Stdout)
	}
}
