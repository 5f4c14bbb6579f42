package workspace

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("workspace tests mount a tmpfs and must run as root")
	}
}

func create(t *testing.T, size int64, files map[string][]byte) *Workspace {
	t.Helper()
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "ws")
	w, err := Create(dir, size, 65534, 65534, files)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestCreateWritesFilesOwnedByNobody(t *testing.T) {
	w := create(t, 1<<20, map[string][]byte{"a.txt": []byte("hello"), "sub/dir/b.bin": {0, 1, 2}})
	for name, want := range map[string]string{"a.txt": "hello", "sub/dir/b.bin": "\x00\x01\x02"} {
		p := filepath.Join(w.Dir, name)
		got, err := os.ReadFile(p)
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
		st, _ := os.Stat(p)
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
			t.Errorf("%s owned by %d; want 65534", name, uid)
		}
	}
	st, _ := os.Stat(filepath.Join(w.Dir, "sub"))
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 65534 {
		t.Errorf("sub owned by %d; want 65534", uid)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(w.Dir, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("workspace is not a tmpfs: %v", err)
	}
}

func TestCreateRefusesFilesOverSize(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "ws")
	_, err := Create(dir, 64<<10, 65534, 65534, map[string][]byte{"big": make([]byte, 1<<20)})
	if err == nil || !strings.Contains(err.Error(), "workspace size") {
		t.Fatalf("Create with 1 MiB in a 64 KiB workspace: err = %v; want workspace size error", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("failed Create left %s behind: %v", dir, err)
	}
}

func TestCollect(t *testing.T) {
	w := create(t, 1<<20, nil)
	os.MkdirAll(filepath.Join(w.Dir, "out"), 0o755)
	os.WriteFile(filepath.Join(w.Dir, "out", "a.png"), []byte("PNG"), 0o644)
	os.WriteFile(filepath.Join(w.Dir, "report.md"), []byte("# r"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(w.Dir, "out", "x.png"))
	os.Symlink("/etc", filepath.Join(w.Dir, "etc"))
	os.Symlink("report.md", filepath.Join(w.Dir, "inner.md"))
	unix.Mkfifo(filepath.Join(w.Dir, "out", "fifo.png"), 0o644)

	got, err := w.Collect([]string{"out/*.png", "report.md", "etc/passwd", "inner.md", "missing.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if f := got["out/a.png"]; f.ContentBase64 != base64.StdEncoding.EncodeToString([]byte("PNG")) || f.Size != 3 || f.Error != "" {
		t.Errorf("out/a.png = %+v", f)
	}
	if f := got["report.md"]; f.ContentBase64 == "" {
		t.Errorf("report.md = %+v", f)
	}
	for _, name := range []string{"out/x.png", "out/fifo.png", "inner.md"} {
		if f := got[name]; f.Error == "" || f.ContentBase64 != "" {
			t.Errorf("%s = %+v; want refused", name, f)
		}
	}
	for name, f := range got {
		if strings.Contains(name, "passwd") || strings.Contains(f.ContentBase64, base64.StdEncoding.EncodeToString([]byte("root:"))[:4]) {
			t.Errorf("collect returned host data via %s: %+v", name, f)
		}
	}
	if _, ok := got["missing.txt"]; ok {
		t.Error("missing file reported")
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "ws")
	w, err := Create(dir, 1<<20, 65534, 65534, map[string][]byte{"f": []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Close left %s: %v", dir, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), dir) {
		t.Errorf("Close left a mount at %s", dir)
	}
}
