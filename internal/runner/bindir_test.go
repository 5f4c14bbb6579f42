package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestCopyIntoNamesByContent checks that a binary's copy is named by its
// content, made once, and that a file of another content under its name
// is refused, not used.
func TestCopyIntoNamesByContent(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	bin := filepath.Join(src, "tini-static")
	if err := os.WriteFile(bin, []byte("\x7fELF one"), 0o755); err != nil {
		t.Fatal(err)
	}
	first, err := copyInto(dir, bin, "init")
	if err != nil {
		t.Fatalf("copyInto: %v", err)
	}
	if filepath.Dir(first) != dir || !strings.HasPrefix(filepath.Base(first), "init-") || strings.Contains(first, src) {
		t.Errorf("copyInto = %s; want %s/init-<sum>", first, dir)
	}
	if st, err := os.Stat(first); err != nil || st.Mode().Perm() != 0o555 {
		t.Errorf("the copy: %v, %v; want mode 0555", st, err)
	}
	if again, err := copyInto(dir, bin, "init"); err != nil || again != first {
		t.Errorf("copyInto again = %s, %v; want %s", again, err, first)
	}
	if err := os.WriteFile(bin, []byte("\x7fELF two"), 0o755); err != nil {
		t.Fatal(err)
	}
	second, err := copyInto(dir, bin, "init")
	if err != nil || second == first {
		t.Errorf("copyInto of other content = %s, %v; want a copy of its own", second, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dir holds %d files; want the 2 copies, no temporary file", len(entries))
	}

	os.Chmod(second, 0o755)
	os.WriteFile(second, []byte("\x7fELF 2wo"), 0o555)
	os.Chmod(second, 0o555)
	if _, err := copyInto(dir, bin, "init"); err == nil || !strings.Contains(err.Error(), "content differs") {
		t.Errorf("copyInto over a changed copy: %v; want its content refused", err)
	}
}

// TestCopyIntoPrunesWhenFull: a tmpfs full of other builds' copies makes
// room for this one by removing them, never failing the runner.
func TestCopyIntoPrunesWhenFull(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("agentrun-test", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	src := t.TempDir()
	var old []string
	for i := range 3 {
		bin := filepath.Join(src, "old")
		os.WriteFile(bin, append([]byte{byte(i)}, make([]byte, 12<<10)...), 0o755)
		p, err := copyInto(dir, bin, "init")
		if err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		old = append(old, p)
	}
	bin := filepath.Join(src, "new")
	os.WriteFile(bin, append([]byte("new"), make([]byte, 36<<10)...), 0o755)
	p, err := copyInto(dir, bin, "init")
	if err != nil {
		t.Fatalf("copyInto a full dir: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	for _, o := range old {
		if _, err := os.Stat(o); err == nil {
			t.Errorf("%s kept in a full dir", o)
		}
	}
}
