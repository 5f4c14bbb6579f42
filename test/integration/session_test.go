package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// sessionCfg is the test config on runtime rt with sessions of maxBytes
// kept in the suite's store.
func sessionCfg(t testing.TB, rt, maxBytes string) *config.Config {
	cfg := cfgFor(t, rt)
	cfg.Sessions.MaxBytes = maxBytes
	return cfg
}

// newSession makes a session with cfg's store and removes it when the
// test ends.
func newSession(t testing.TB, cfg *config.Config) (*runner.Runner, string) {
	t.Helper()
	r, err := runner.New(cfg, nil)
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
	return r.Run(context.Background(), plan)
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
		want := "from run 1\ntmp: []\nenv: None\nprocs: ['python3']\n"
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

// TestSessionBusy: a second run while one runs is refused at once with
// "session busy" and exit 125; rm of a busy session is refused; when idle,
// the session runs again and rm removes it.
func TestSessionBusy(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "32m")
	r, id := newSession(t, cfg)
	var wg sync.WaitGroup
	var first *result.Result
	wg.Add(1)
	go func() {
		defer wg.Done()
		first = runSession(t, r, cfg, id, `import time; time.sleep(3); print("first")`, nil)
	}()
	waitBusy(t, r, id)
	start := time.Now()
	second := runSession(t, r, cfg, id, `print("second")`, nil)
	if !strings.Contains(second.Error, "session busy") || second.ExitStatus() != 125 || second.Stdout != "" {
		t.Errorf("second run: error %q, exit %d, stdout %q", second.Error, second.ExitStatus(), second.Stdout)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusal took %v, want at once", d)
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
	cfg.Sessions.TTL = "1h"
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
