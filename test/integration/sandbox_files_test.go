package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/task"
)

// TestLiveSandboxFilePlaces: the host reaches a live sandbox's files in
// both its writable places, /workspace and its capped /tmp (a tmpfs the
// host made), by absolute path or relative to /workspace: stat, make a
// directory with its parents, move within a place, list with depth;
// what it makes is the sandbox's user's. Any other place is refused, and
// a link, fifo or hard link a process plants is never followed, written
// through or waited on. Closing leaves nothing.
func TestLiveSandboxFilePlaces(t *testing.T) {
	r, err := compose.Runner(testConfig(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	plan, err := task.Load([]byte(`{"image": "`+busyboxImage+`", "command": ["true"], "limits": {"tmp_size": "1m"}}`), testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.Create(context.Background(), r, plan, "alice", sandbox.Options{Lifetime: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	sh := func(cmd string) string {
		t.Helper()
		out, errOut, exit := liveExec(t, sb, sandbox.ExecRequest{Cmd: cmd})
		if *exit.ExitCode != 0 {
			t.Fatalf("%q in the sandbox: exit %d: %s%s", cmd, *exit.ExitCode, out, errOut)
		}
		return out
	}
	uid := strings.TrimSpace(sh("id -u"))

	// /tmp is the host's tmpfs, 1777, capped as the plan says.
	if got := sh("stat -c %a /tmp; mount | grep ' /tmp '"); !strings.HasPrefix(got, "1777\n") || !strings.Contains(got, "noexec") {
		t.Errorf("/tmp in the sandbox: %q", got)
	}
	if _, errOut, exit := liveExec(t, sb, sandbox.ExecRequest{Cmd: "dd if=/dev/zero of=/tmp/big bs=1024 count=2048"}); *exit.ExitCode == 0 || !strings.Contains(errOut, "space") {
		t.Errorf("2 MiB into a 1 MiB /tmp: exit %d, %q", *exit.ExitCode, errOut)
	}
	sh("rm -f /tmp/big")

	// Both ways, in /tmp by absolute path.
	if err := sb.WriteFile("/tmp/a/b.txt", strings.NewReader("hello"), 5); err != nil {
		t.Fatal(err)
	}
	if got := sh("cat /tmp/a/b.txt; stat -c %u /tmp/a /tmp/a/b.txt"); got != "hello"+uid+"\n"+uid+"\n" {
		t.Errorf("a file the host wrote in /tmp, seen inside (uid %s): %q", uid, got)
	}
	sh("printf made > /tmp/made")
	if got, err := sb.ReadFile("/tmp/made", 100); err != nil || string(got) != "made" {
		t.Errorf("reading /tmp/made: %q, %v", got, err)
	}
	if err := sb.WriteFile("/tmp/huge", strings.NewReader(strings.Repeat("x", 2<<20)), 2<<20); errkind.Of(err) != errkind.TooLarge {
		t.Errorf("2 MiB written into a 1 MiB /tmp: %v", err)
	}

	// Stat: a file, a place's root, a link (described, never followed).
	if fi, err := sb.Stat("/tmp/a/b.txt"); err != nil || fi.Name != "b.txt" || fi.Path != "/tmp/a/b.txt" || fi.Type != "file" || fi.Size != 5 || strconv.Itoa(fi.UID) != uid {
		t.Errorf("stat /tmp/a/b.txt: %+v, %v", fi, err)
	}
	if fi, err := sb.Stat("/workspace"); err != nil || fi.Type != "dir" || fi.Path != "/workspace" {
		t.Errorf("stat /workspace: %+v, %v", fi, err)
	}

	// MakeDir with its parents, the sandbox's user's; twice is no error.
	if created, err := sb.MakeDir("/tmp/x/y/z"); err != nil || !created {
		t.Errorf("making /tmp/x/y/z: %v, %v", created, err)
	}
	if created, err := sb.MakeDir("/tmp/x/y/z"); err != nil || created {
		t.Errorf("making /tmp/x/y/z again: %v, %v", created, err)
	}
	if got := sh("stat -c %u /tmp/x /tmp/x/y/z"); got != uid+"\n"+uid+"\n" {
		t.Errorf("owners of the dirs made: %q, want %s", got, uid)
	}
	if _, err := sb.MakeDir("/tmp/a/b.txt/c"); err == nil {
		t.Errorf("a directory made under a file")
	}

	// Move within a place, parents made; across places refused.
	if err := sb.WriteFile("src.txt", strings.NewReader("moved"), 5); err != nil {
		t.Fatal(err)
	}
	if err := sb.Rename("src.txt", "/workspace/d1/d2/dst.txt"); err != nil {
		t.Errorf("moving src.txt: %v", err)
	}
	if got := sh("cat /workspace/d1/d2/dst.txt; test -e /workspace/src.txt || echo gone"); got != "movedgone\n" {
		t.Errorf("after the move: %q", got)
	}
	if err := sb.Rename("/tmp/made", "/workspace/made"); errkind.Of(err) != errkind.Invalid {
		t.Errorf("a move from /tmp to /workspace: %v", err)
	}

	// List with depth: each directory's entries by name, then theirs.
	list, err := sb.ListDepth("/workspace", 3)
	var paths []string
	for _, f := range list {
		paths = append(paths, f.Path)
	}
	if want := "/workspace/d1 /workspace/d1/d2 /workspace/d1/d2/dst.txt"; err != nil || strings.Join(paths, " ") != want {
		t.Errorf("list /workspace depth 3: %q, %v; want %q", paths, err, want)
	}
	if list, err := sb.ListDepth("", 1); err != nil || len(list) != 1 || list[0].Name != "d1" {
		t.Errorf("list /workspace depth 1: %+v, %v", list, err)
	}
	if _, err := sb.ListDepth("", 0); err == nil {
		t.Errorf("a list of depth 0 was taken")
	}

	// Outside the writable places: refused, whatever the call.
	for _, name := range []string{"/etc/passwd", "/", "/dev/shm/x", "/proc/self/environ", "/workspacex/y",
		"/tmp/../etc/passwd", "../etc/passwd", "/usr/bin", "/tmp\x00/x"} {
		if _, err := sb.ReadFile(name, 100); !errors.Is(err, sandbox.ErrBadPath) {
			t.Errorf("reading %q: %v", name, err)
		}
		if _, err := sb.Stat(name); !errors.Is(err, sandbox.ErrBadPath) {
			t.Errorf("stat %q: %v", name, err)
		}
		if _, err := sb.MakeDir(name); !errors.Is(err, sandbox.ErrBadPath) {
			t.Errorf("making %q: %v", name, err)
		}
	}
	for _, name := range []string{"/tmp", "/workspace", ""} {
		if err := sb.Remove(name); err == nil {
			t.Errorf("removing the place %q itself was taken", name)
		}
	}

	// Planted from inside: links to the host's files, a fifo, a hard
	// link.
	host := t.TempDir()
	secret := filepath.Join(host, "secret")
	if err := os.WriteFile(secret, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	sh("ln -s " + secret + " /tmp/link; ln -s " + host + " /tmp/dlink; mkfifo /tmp/fifo; " +
		"printf orig > /tmp/orig; ln /tmp/orig /tmp/hard; ln -s /etc /workspace/etc")
	if got, err := sb.ReadFile("/tmp/link", 100); err == nil {
		t.Errorf("a read through a planted link got %q", got)
	}
	if fi, err := sb.Stat("/tmp/link"); err != nil || fi.Type != "symlink" || fi.Target != secret {
		t.Errorf("stat of a planted link: %+v, %v", fi, err)
	}
	done := make(chan error, 1)
	go func() { _, err := sb.ReadFile("/tmp/fifo", 100); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("a read of a planted fifo succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("a read of a planted fifo blocks the host")
	}
	if fi, err := sb.Stat("/tmp/fifo"); err != nil || fi.Type != "other" {
		t.Errorf("stat of a fifo: %+v, %v", fi, err)
	}
	for _, name := range []string{"/tmp/dlink", "/workspace/etc"} {
		if _, err := sb.List(name); err == nil {
			t.Errorf("a list through the planted directory link %s succeeded", name)
		}
		if _, err := sb.ReadFile(name+"/passwd", 100); err == nil {
			t.Errorf("a read through the planted directory link %s succeeded", name)
		}
	}
	if list, err := sb.ListDepth("/tmp", 4); err != nil {
		t.Errorf("list /tmp: %v", err)
	} else {
		for _, f := range list {
			if strings.HasPrefix(f.Path, "/tmp/dlink/") || f.Name == "secret" {
				t.Errorf("a deep list went through the planted link: %+v", f)
			}
		}
	}
	if _, err := sb.MakeDir("/tmp/dlink/sub"); err == nil {
		t.Errorf("a directory made through a planted link")
	}
	if err := sb.Rename("/tmp/a/b.txt", "/tmp/dlink/b.txt"); err == nil {
		t.Errorf("a move through a planted link")
	}
	if err := sb.WriteFile("/tmp/dlink/new", strings.NewReader("x"), 1); err == nil {
		t.Errorf("a write through a planted directory link succeeded")
	}
	if err := sb.WriteFile("/tmp/link", strings.NewReader("pwned"), 5); err != nil {
		t.Errorf("a write over a planted link: %v", err)
	}
	if err := sb.WriteFile("/tmp/hard", strings.NewReader("new"), 3); err != nil {
		t.Errorf("a write over a hard link: %v", err)
	}
	if got := sh("cat /tmp/orig"); got != "orig" {
		t.Errorf("a write over a hard link wrote through it: the other name holds %q", got)
	}
	if err := sb.Rename("/tmp/dlink", "/tmp/dlink2"); err != nil {
		t.Errorf("moving a planted link: %v", err)
	}
	if err := sb.Remove("/tmp/dlink2"); err != nil {
		t.Errorf("removing a planted link: %v", err)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "host" {
		t.Errorf("the host file the link named: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(host); len(ents) != 1 {
		t.Errorf("the host dir the link named holds %d entries", len(ents))
	}
	if err := sb.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	assertNoLeaks(t)
}

// TestServeSandboxFilePaths: serve's files routes take a path absolute
// in the sandbox's /tmp (its first slash escaped) and list with depth,
// each entry with its path; a place outside is 400.
func TestServeSandboxFilePaths(t *testing.T) {
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	s := startServeWith(t, cfg)
	a := createSandbox(t, s)
	sb := "/v1/sandboxes/" + a.ID
	if resp, b := s.do("PUT", sb+"/files/%2Ftmp/d/e/f.txt", "hello"); resp.StatusCode != 204 {
		t.Fatalf("PUT /tmp/d/e/f.txt: %d %s", resp.StatusCode, b)
	}
	if out, _ := execOut(t, s, a.ID, `{"cmd": "cat /tmp/d/e/f.txt"}`); out != "hello" {
		t.Errorf("the sandbox reads %q", out)
	}
	if resp, b := s.do("GET", sb+"/files/%2Ftmp%2Fd%2Fe%2Ff.txt", ""); resp.StatusCode != 200 || string(b) != "hello" {
		t.Errorf("GET /tmp/d/e/f.txt: %d %q", resp.StatusCode, b)
	}
	var files []runapi.FileInfo
	resp, b := s.do("GET", sb+"/files/%2Ftmp?list=1&depth=3", "")
	if err := json.Unmarshal(b, &files); resp.StatusCode != 200 || err != nil {
		t.Fatalf("list /tmp: %d %s", resp.StatusCode, b)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	if want := "/tmp/d /tmp/d/e /tmp/d/e/f.txt"; strings.Join(paths, " ") != want {
		t.Errorf("list /tmp depth 3: %q, want %q", paths, want)
	}
	for _, p := range []string{"%2Fetc%2Fpasswd", "%2Fdev%2Fshm%2Fx", "%2Ftmp?list=1&depth=0"} {
		if resp, b := s.do("GET", sb+"/files/"+p, ""); resp.StatusCode != 400 {
			t.Errorf("GET files/%s: %d %s, want 400", p, resp.StatusCode, b)
		}
	}
	if resp, _ := s.do("DELETE", sb+"/files/%2Ftmp/d", ""); resp.StatusCode != 204 {
		t.Errorf("DELETE /tmp/d: %d", resp.StatusCode)
	}
	if resp, _ := s.do("GET", sb+"/files/%2Ftmp/d/e/f.txt", ""); resp.StatusCode != 404 {
		t.Errorf("GET after DELETE: %d", resp.StatusCode)
	}
}
