package cachefile

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestWriteRead: what Write wrote is read back whole, and nothing else is
// left in the directory; a file others may read, a symbolic link and a
// file past its bound are not read.
func TestWriteRead(t *testing.T) {
	testenv.RequireRoot(t) // a cache file is root's
	dir := filepath.Join(t.TempDir(), "cache")
	data := []byte("derived bytes")
	if err := Write(dir, "k", data); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(filepath.Join(dir, "k"), int64(len(data))); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %q, %v", got, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d files, want k alone", len(entries))
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	if _, err := Read(filepath.Join(dir, "k"), int64(len(data))-1); err == nil {
		t.Error("a file past its bound was read")
	}
	if err := os.Symlink(filepath.Join(dir, "k"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(filepath.Join(dir, "link"), 1<<10); err == nil {
		t.Error("a symbolic link was followed")
	}
	if err := os.Chmod(filepath.Join(dir, "k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(filepath.Join(dir, "k"), 1<<10); err == nil {
		t.Error("a file others may read was read")
	}
	if err := os.Chown(filepath.Join(dir, "k"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "k"), 0o600)
	if _, err := Read(filepath.Join(dir, "k"), 1<<10); err == nil {
		t.Error("a file of another user was read")
	}
}

// TestTemporary: the names Write writes through are told apart.
func TestTemporary(t *testing.T) {
	for name, want := range map[string]bool{".tmp-123": true, ".tmp-": true, "k": false, ".tmp": false, "x.tmp-1": false} {
		if Temporary(name) != want {
			t.Errorf("Temporary(%q) = %v", name, !want)
		}
	}
}
