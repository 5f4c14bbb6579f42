package runner

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// hostStatus is bin's status as StageBinary keys it.
func hostStatus(t *testing.T, bin string) stagedCopy {
	t.Helper()
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	return statusOf(st.Sys().(*syscall.Stat_t))
}

// TestStampedCopy checks that a stamped copy is found from the status of
// the host file and of the copy alone, and that a host file changed in
// place, a copy changed since its stamp, or a stamp not as written is a
// miss, never a copy used.
func TestStampedCopy(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	bin := filepath.Join(src, "tini-static")
	if err := os.WriteFile(bin, []byte("\x7fELF one"), 0o755); err != nil {
		t.Fatal(err)
	}
	stage := func() string {
		t.Helper()
		host := hostStatus(t, bin)
		p, err := copyInto(dir, bin, "init")
		if err != nil {
			t.Fatal(err)
		}
		if err := writeStamp(dir, bin, "init", host, p); err != nil {
			t.Fatalf("writeStamp: %v", err)
		}
		return p
	}
	copy := stage()
	if p, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); !ok || p != copy {
		t.Fatalf("stampedCopy = %q, %v; want %s", p, ok, copy)
	}
	if _, ok := stampedCopy(dir, filepath.Join(src, "other"), "init", hostStatus(t, bin)); ok {
		t.Error("a stamp found for another host file")
	}
	if _, ok := stampedCopy(dir, bin, "agentrun-seccomp", hostStatus(t, bin)); ok {
		t.Error("a stamp found under another name")
	}

	// The host file written in place, its size unchanged.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(bin, []byte("\x7fELF two"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); ok {
		t.Errorf("the stamp of the file before it changed gave %s", p)
	}

	// The copy changed since its stamp (written, or its mode changed and
	// set back): its change time is not the stamp's.
	copy = stage()
	time.Sleep(10 * time.Millisecond)
	os.Chmod(copy, 0o755)
	os.WriteFile(copy, []byte("\x7fELF 2wo"), 0o755)
	os.Chmod(copy, 0o555)
	if p, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); ok {
		t.Errorf("a copy changed after its stamp was used: %s", p)
	}
	if _, err := copyInto(dir, bin, "init"); err == nil {
		t.Error("after the miss, copyInto took the changed copy")
	}
	os.Remove(copy)

	// A stamp of another mode, and one naming a file that is no copy.
	copy = stage()
	stamp := stampPath(dir, bin, "init")
	os.Chmod(stamp, 0o644)
	if _, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); ok {
		t.Error("a stamp of mode 0644 was used")
	}
	os.Chmod(stamp, 0o444)
	if _, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); !ok {
		t.Fatal("the stamp set back to 0444 was not used")
	}
	os.Remove(copy)
	if _, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); ok {
		t.Error("a stamp of a removed copy was used")
	}
	b, _ := os.ReadFile(stamp)
	os.Remove(stamp)
	os.WriteFile(stamp, append([]byte("../x"), b[len("init-0123456789abcdef"):]...), 0o444)
	if _, ok := stampedCopy(dir, bin, "init", hostStatus(t, bin)); ok {
		t.Error("a stamp naming ../x was used")
	}
}
