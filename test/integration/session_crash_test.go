package integration

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/session"
)

// mountLikeACrash mounts session id's disk at its host-side mount point
// through a loop device with autoclear (mount -o loop), as an agentrun
// killed in the middle of a file access leaves it.
func mountLikeACrash(t *testing.T, id string) string {
	t.Helper()
	mp := filepath.Join(stateDir, "sessions", id)
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(stateDir, "store", "sessions", id, "disk.img")
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noexec", img, mp).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	return mp
}

// TestSessionStaleMountPoint: agentrun killed between making a session's
// mount point and mounting its disk leaves the directory; killed after,
// the mount too. The next file access, holding the session, removes
// either and goes on; gc removes them for a session no one holds and for
// one that is gone. A mount point holding anything is not agentrun's: it
// is refused and nothing in it is deleted.
func TestSessionStaleMountPoint(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "16m")
	r, id := newSession(t, cfg)
	st := r.Sessions()
	mp := filepath.Join(stateDir, "sessions", id)

	// Killed before the mount: the directory alone.
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteFile(id, "a.txt", strings.NewReader("after an empty mount point")); err != nil {
		t.Errorf("write with an empty mount point left: %v", err)
	}
	assertNoLeaks(t)

	// Killed after the mount: the disk is still mounted there.
	mountLikeACrash(t, id)
	if data, err := st.ReadFile(id, "a.txt"); err != nil || string(data) != "after an empty mount point" {
		t.Errorf("read with a mount left: %q, %v", data, err)
	}
	if err := st.WriteFile(id, "b.txt", strings.NewReader("after a mount")); err != nil {
		t.Errorf("write with a mount left: %v", err)
	}
	assertNoLeaks(t)

	// And a run in the session afterwards.
	res := runSession(t, r, cfg, id, `print(open("a.txt").read(), open("b.txt").read())`, nil)
	mustOK(t, res)
	if res.Stdout != "after an empty mount point after a mount\n" {
		t.Errorf("run after the leftovers: %q", res.Stdout)
	}

	// gc: a free session's leftover mount, and the empty mount point of a
	// session that is gone.
	mountLikeACrash(t, id)
	var b [16]byte
	rand.Read(b[:])
	gone := filepath.Join(stateDir, "sessions", "ss-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(gone, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := r.GC(); err != nil {
		t.Errorf("gc: %v", err)
	}
	assertNoLeaks(t)
	if data, err := st.ReadFile(id, "b.txt"); err != nil || string(data) != "after a mount" {
		t.Errorf("read after gc: %q, %v", data, err)
	}

	// Not agentrun's: refused, kept.
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(mp, "someone-elses")
	if err := os.WriteFile(keep, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := st.WriteFile(id, "c.txt", strings.NewReader("x"))
	if err == nil || !strings.Contains(err.Error(), "stale session mount point") {
		t.Errorf("write with a full directory at the mount point: %v", err)
	}
	if _, err := r.GC(); err == nil || !strings.Contains(err.Error(), "stale session mount point") {
		t.Errorf("gc with a full directory at the mount point: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a file at the mount point was deleted: %v", err)
	}
	os.RemoveAll(mp)
	assertNoLeaks(t)
}

// TestSessionSurvivesReboot: a session with files, its disk mounted by an
// upload that a reboot cut short. The reboot is played out: every process
// of agentrun killed, every mount under the state dir unmounted and its
// loop device detached, the state dir (a tmpfs, as /run is) gone; the
// store dir is kept, as a disk is. A new agentrun on a fresh state dir
// lists the session, its files intact, runs in it, and gc keeps it until
// it has been idle for sessions.ttl, then removes it.
func TestSessionSurvivesReboot(t *testing.T) {
	bin := agentrunBin(t)
	top := t.TempDir()
	run, store := filepath.Join(top, "run"), filepath.Join(top, "lib")
	for _, d := range []string{run, store} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	boot := func() {
		t.Helper()
		if err := unix.Mount("tmpfs", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64m,mode=0755"); err != nil {
			t.Fatalf("mounting the state tmpfs: %v", err)
		}
	}
	boot()
	cleanedUp := false
	defer func() {
		if !cleanedUp {
			unmountAll(t, top)
		}
	}()
	cfgPath := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": filepath.Join(run, "agentrun"),
		"store_dir": store, "audit": "", "sessions": map[string]any{"max_bytes": "16m", "ttl": "1h"}})
	agentrun := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{args[0], "--config", cfgPath}, args[1:]...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("agentrun %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	id := strings.TrimSpace(agentrun("", "sessions", "new"))
	agentrun(`{"session":"`+id+`","keep_workspace":true,"code":"import os\nos.makedirs('/workspace/data')\nopen('/workspace/data/kept.txt', 'w').write('before the reboot')"}`,
		"run", "-")
	agentrun("uploaded", "sessions", "put", id, "up.txt")

	// An upload in progress when the host goes down: the disk is mounted.
	put := exec.Command(bin, "sessions", "--config", cfgPath, "put", id, "cut.txt")
	stdin, err := put.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("partial"))
	for deadline := time.Now().Add(10 * time.Second); len(mountPointsAt(run)) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			put.Process.Kill()
			put.Wait()
			t.Fatal("the upload's mount never showed")
		}
	}

	// The reboot.
	put.Process.Signal(syscall.SIGKILL)
	put.Wait()
	stdin.Close()
	unmountAll(t, top)
	if ms := mountPointsAt(top); len(ms) > 0 {
		t.Fatalf("mounts after the reboot: %v", ms)
	}
	if loops := loopsBackedUnder(store); len(loops) > 0 {
		t.Fatalf("loop devices after the reboot: %v", loops)
	}
	if ents, _ := os.ReadDir(run); len(ents) > 0 {
		t.Fatalf("the state dir outlived the reboot: %v", ents)
	}
	boot()

	if ls := agentrun("", "sessions", "ls"); !strings.Contains(ls, id) {
		t.Errorf("sessions ls after the reboot: %s", ls)
	}
	if files := agentrun("", "sessions", "files", id); !strings.Contains(files, "data/kept.txt") || !strings.Contains(files, "up.txt") {
		t.Errorf("sessions files after the reboot: %s", files)
	}
	if got := agentrun("", "sessions", "cat", id, "up.txt"); got != "uploaded" {
		t.Errorf("sessions cat after the reboot: %q", got)
	}
	if out := agentrun(`{"session":"`+id+`","keep_workspace":true,"code":"print(open('data/kept.txt').read())"}`, "run", "-"); !strings.Contains(out, `"stdout": "before the reboot\n"`) {
		t.Errorf("run after the reboot: %s", out)
	}

	// A fork's copies hold the files, each its own.
	copies := strings.Fields(agentrun("", "sessions", "fork", id, "2"))
	if len(copies) != 2 || copies[0] == id || copies[1] == copies[0] {
		t.Fatalf("sessions fork %s 2: %q", id, copies)
	}
	for _, c := range copies {
		if got := agentrun("", "sessions", "cat", c, "data/kept.txt"); got != "before the reboot" {
			t.Errorf("sessions cat of fork %s: %q", c, got)
		}
	}
	agentrun("changed", "sessions", "put", copies[0], "up.txt")
	if got := agentrun("", "sessions", "cat", id, "up.txt"); got != "uploaded" {
		t.Errorf("the source after a write to its fork: %q", got)
	}
	for _, c := range copies {
		agentrun("", "sessions", "rm", c)
	}

	// The TTL counts from the last use, which the store keeps.
	agentrun("", "gc")
	if ls := agentrun("", "sessions", "ls"); !strings.Contains(ls, id) {
		t.Errorf("gc removed a session used just now: %s", ls)
	}
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(filepath.Join(store, "sessions", id, "lock"), old, old); err != nil {
		t.Fatal(err)
	}
	if out := agentrun("", "gc"); !strings.Contains(out, id) {
		t.Errorf("gc of a session idle past its TTL: %s", out)
	}
	if ls := agentrun("", "sessions", "ls"); strings.Contains(ls, id) {
		t.Errorf("sessions ls after gc: %s", ls)
	}
	if ents, _ := os.ReadDir(filepath.Join(store, "sessions")); len(ents) != 1 { // the store's lock
		t.Errorf("the store holds %d entries after gc", len(ents))
	}
	unmountAll(t, top)
	cleanedUp = true
	if loops := loopsBackedUnder(top); len(loops) > 0 {
		t.Errorf("loop devices left: %v", loops)
	}
	assertNoLeaks(t)
}

// mountPointsAt lists the mount points at or below dir.
func mountPointsAt(dir string) []string {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// unmountAll unmounts everything at or below dir, deepest first, and waits
// for the loop devices of what it unmounted to go (autoclear), as a
// shutdown does.
func unmountAll(t *testing.T, dir string) {
	t.Helper()
	for ms := mountPointsAt(dir); len(ms) > 0; ms = mountPointsAt(dir) {
		deepest := ms[0]
		for _, m := range ms {
			if len(m) > len(deepest) {
				deepest = m
			}
		}
		if err := unix.Unmount(deepest, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmounting %s: %v", deepest, err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); len(loopsBackedUnder(dir)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices still attached: %v", loopsBackedUnder(dir))
		}
	}
}

// loopsBackedUnder lists the loop devices whose backing file is below dir.
func loopsBackedUnder(dir string) []string {
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, b := range backing {
		if f, err := os.ReadFile(b); err == nil && strings.HasPrefix(string(f), dir+"/") {
			out = append(out, b)
		}
	}
	return out
}

// TestSessionFileRefusalsSayWhy: a file access through what a program left
// in its session (a symbolic link out, a file where a directory should be)
// is refused with words about the session's own paths, never an
// operation's name, os.Root's "path escapes from parent" or a host path.
func TestSessionFileRefusalsSayWhy(t *testing.T) {
	cfg := sessionCfg(t, "libcontainer", "16m")
	r, id := newSession(t, cfg)
	mustOK(t, runSession(t, r, cfg, id, `import os
os.makedirs("d")
os.symlink("/etc", "d/etclink")
os.symlink("../../..", "up")
open("f", "w").write("x")`, nil))
	st := r.Sessions()
	write := func(name string) error { return st.WriteFile(id, name, strings.NewReader("x")) }
	read := func(name string) error { _, err := st.ReadFile(id, name); return err }
	for _, c := range []struct {
		what, name string
		do         func(string) error
		want       string
	}{
		{"write through a link out", "d/etclink/x", write, `"d/etclink" is a symbolic link, which is never followed`},
		{"read through a link out", "d/etclink/passwd", read, `"d/etclink" is a symbolic link, which is never followed`},
		{"read through a link up", "up/x", read, `"up" is a symbolic link, which is never followed`},
		{"read of a link", "up", read, `"up" is a symbolic link, which is never followed`},
		{"write under a file", "f/x", write, `"f" is not a directory`},
		{"read under a missing directory", "nope/x", read, `directory "nope" does not exist`},
		{"read of a missing file", "nope", read, "no such file"},
	} {
		err := c.do(c.name)
		if !errors.Is(err, session.ErrBadPath) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q", c.what, err, c.want)
			continue
		}
		for _, bad := range []string{"escapes", "openat", "mkdirat", "statat", stateDir, "/etc/"} {
			if strings.Contains(err.Error(), bad) {
				t.Errorf("%s: %v: says %q", c.what, err, bad)
			}
		}
	}
	assertNoLeaks(t)
}
