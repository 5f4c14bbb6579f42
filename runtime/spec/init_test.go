package spec

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestWithInit: the init comes first in argv whichever option is applied
// first, its mount is read-only, and Validate lets no other bind mount go
// without noexec.
func TestWithInit(t *testing.T) {
	want := []string{InitPath, "--", "python3", "-c", "1"}
	for _, order := range [][]SpecOpt{
		{WithInit("/usr/bin/tini-static"), WithArgs("python3", "-c", "1")},
		{WithArgs("python3", "-c", "1"), WithInit("/usr/bin/tini-static")},
	} {
		s := valid(t, order...)
		if !slices.Equal(s.Process.Args, want) {
			t.Errorf("args %q; want %q", s.Process.Args, want)
		}
		m := mount(s, InitPath)
		if m == nil || !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") {
			t.Errorf("init mount %+v; want a read-only nosuid bind", m)
		}
	}
	s := valid(t, WithArgs("x"), WithInit("/usr/bin/tini-static"))
	for i := range s.Mounts {
		if s.Mounts[i].Destination == InitPath {
			s.Mounts[i].Destination = "/dev/other"
		}
	}
	if err := Validate(s); err == nil || !strings.Contains(err.Error(), "lacks noexec") {
		t.Errorf("Validate of an exec bind mount at /dev/other: %v; want refused", err)
	}
	if _, err := New("/r", WithInit("/usr/bin/tini-static"), WithInit("/usr/bin/tini-static")); err == nil {
		t.Error("two inits accepted")
	}
}

func TestCheckInit(t *testing.T) {
	dir := t.TempDir()
	writable := filepath.Join(dir, "w")
	os.WriteFile(writable, []byte("\x7fELF"), 0o777)
	os.Chmod(writable, 0o777)
	for path, want := range map[string]string{
		filepath.Join(dir, "none"): "no such file",
		dir:                        "not a regular file",
		writable:                   "writable by no one else",
		"/usr/bin/tini":            "dynamically linked",
	} {
		if err := CheckInit(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckInit(%s) = %v; want %q", path, err, want)
		}
	}
	if err := CheckInit("/usr/bin/tini-static"); err != nil {
		t.Errorf("CheckInit(tini-static): %v", err)
	}
}
