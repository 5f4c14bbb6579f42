package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
