package safefs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// both runs f with openat2 and with the component walk of a kernel
// without it.
func both(t *testing.T, f func(t *testing.T)) {
	for _, walk := range []bool{false, true} {
		t.Run("walk="+strconv.FormatBool(walk), func(t *testing.T) {
			forceWalk = walk
			t.Cleanup(func() { forceWalk = false })
			f(t)
		})
	}
}

// tree makes a directory root (returned, opened) and, beside it, outside
// with a file secret holding "host"; under root: file "f" ("in"), dir "d"
// with "d/g", and whatever links and nodes the tests use.
func tree(t *testing.T) (*Dir, string, string) {
	t.Helper()
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "d")} {
		must(t, os.Mkdir(d, 0o755))
	}
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o600))
	must(t, os.WriteFile(filepath.Join(root, "f"), []byte("in"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "d", "g"), []byte("g"), 0o644))
	for link, to := range map[string]string{
		"leaf":     filepath.Join(outside, "secret"), // to a host file
		"new":      filepath.Join(outside, "created"),
		"inner":    "f", // to a file inside
		"dlink":    outside,
		"dinner":   "d",
		"procfd":   "/proc/self/fd",
		"procroot": "/proc/self/root",
	} {
		must(t, os.Symlink(to, filepath.Join(root, link)))
	}
	must(t, unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	d, err := Open(root)
	must(t, err)
	t.Cleanup(func() { d.Close() })
	return d, root, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// untouched fails unless the host file is as tree left it and nothing
// was created beside it.
func untouched(t *testing.T, outside string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(outside, "secret"))
	st, _ := os.Stat(filepath.Join(outside, "secret"))
	if err != nil || string(b) != "host" || st.Mode().Perm() != 0o600 {
		t.Errorf("host file now %q (%v, mode %v); want \"host\", 0600", b, err, st.Mode())
	}
	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 {
		t.Errorf("outside holds %d entries; want 1 (secret)", len(ents))
	}
}

func TestReadAndWriteInside(t *testing.T) {
	both(t, func(t *testing.T) {
		d, root, _ := tree(t)
		if b, err := d.ReadFile("d/g", 10); err != nil || string(b) != "g" {
			t.Errorf("ReadFile(d/g) = %q, %v", b, err)
		}
		must(t, d.WriteFile("d/new", []byte("x"), 0o640))
		if b, _ := os.ReadFile(filepath.Join(root, "d", "new")); string(b) != "x" {
			t.Errorf("d/new holds %q", b)
		}
		if err := d.WriteFile("d/new", []byte("y"), 0o640); !errors.Is(err, fs.ErrExist) {
			t.Errorf("WriteFile over an existing file: %v; want exist", err)
		}
		must(t, d.MkdirAll("a/b/c", 0o755))
		must(t, d.Rename("d/new", "a/b/c/moved"))
		if fi, err := d.Stat("a/b/c/moved"); err != nil || fi.Size() != 1 || fi.Mode().Perm() != 0o640 {
			t.Errorf("Stat(a/b/c/moved) = %v, %v", fi, err)
		}
		must(t, d.Remove("a/b/c/moved"))
		must(t, d.Remove("a/b/c"))
		sub, err := d.Sub("a/b")
		must(t, err)
		defer sub.Close()
		must(t, sub.WriteFile("s", nil, 0o600))
		if _, err := os.Stat(filepath.Join(root, "a", "b", "s")); err != nil {
			t.Errorf("Sub's file: %v", err)
		}
		if b, err := d.ReadFile("f", 1); !errors.Is(err, ErrTooLarge) || string(b) != "i" {
			t.Errorf("ReadFile(f, 1) = %q, %v; want \"i\", too large", b, err)
		}
		if fi, err := d.Stat("."); err != nil || !fi.IsDir() {
			t.Errorf("Stat(.) = %v, %v", fi, err)
		}
	})
}

// A link is never followed: not at the leaf, not in a middle component,
// not to the host, not to a file inside, not through /proc.
func TestLinksRefused(t *testing.T) {
	both(t, func(t *testing.T) {
		d, root, outside := tree(t)
		for _, name := range []string{"leaf", "inner", "dlink/secret", "dinner/g", "procfd/0", "procroot/etc/passwd", "procfd"} {
			if _, err := d.Open(name); err == nil {
				t.Errorf("Open(%s) opened", name)
			}
			if _, err := d.ReadFile(name, 100); err == nil {
				t.Errorf("ReadFile(%s) read", name)
			}
			if _, err := d.Stat(name); err == nil {
				t.Errorf("Stat(%s) followed", name)
			}
			if _, err := d.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0); err == nil {
				t.Errorf("OpenFile(%s, O_WRONLY|O_TRUNC) opened", name)
			}
		}
		for _, name := range []string{"leaf", "new", "inner", "dlink/secret", "dlink/created", "procfd/5", "dinner/h"} {
			if err := d.WriteFile(name, []byte("pwned"), 0o666); err == nil {
				t.Errorf("WriteFile(%s) wrote", name)
			}
			if _, err := d.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666); err == nil {
				t.Errorf("OpenFile(%s, O_CREATE without O_EXCL) opened", name)
			}
		}
		for _, name := range []string{"dlink/sub", "dinner/sub", "dlink/a/b"} {
			if err := d.Mkdir(name, 0o755); err == nil {
				t.Errorf("Mkdir(%s) made it", name)
			}
			if err := d.MkdirAll(name, 0o755); err == nil {
				t.Errorf("MkdirAll(%s) made it", name)
			}
		}
		if _, err := d.Sub("dlink"); err == nil {
			t.Error("Sub(dlink) opened")
		}
		if err := d.Remove("dlink/secret"); err == nil {
			t.Error("Remove(dlink/secret) removed")
		}
		if err := d.Rename("f", "dlink/stolen"); err == nil {
			t.Error("Rename(f, dlink/stolen) moved it out")
		}
		if err := d.Rename("dlink/secret", "stolen"); err == nil {
			t.Error("Rename(dlink/secret, stolen) moved it in")
		}
		if err := d.Lchown("dlink/secret", 65534, 65534); err == nil {
			t.Error("Lchown(dlink/secret) changed it")
		}
		// The link itself: Lstat describes it, Lchown and Remove act on it.
		if fi, err := d.Lstat("leaf"); err != nil || fi.Mode()&fs.ModeSymlink == 0 || fi.Name() != "leaf" {
			t.Errorf("Lstat(leaf) = %v, %v; want the link", fi, err)
		}
		if os.Geteuid() == 0 {
			must(t, d.Lchown("leaf", 65534, 65534))
			var st unix.Stat_t
			unix.Lstat(filepath.Join(root, "leaf"), &st)
			if st.Uid != 65534 {
				t.Errorf("Lchown(leaf): link owned by %d; want 65534", st.Uid)
			}
			unix.Stat(filepath.Join(outside, "secret"), &st)
			if st.Uid == 65534 {
				t.Error("Lchown(leaf) changed the host file's owner")
			}
		}
		must(t, d.Remove("leaf"))
		untouched(t, outside)
	})
}

func TestBadNames(t *testing.T) {
	both(t, func(t *testing.T) {
		d, _, outside := tree(t)
		for _, name := range []string{"", "..", "../outside/secret", "d/../f", "d/../../outside/secret", "/etc/passwd", filepath.Join(outside, "secret")} {
			if _, err := d.Open(name); !errors.Is(err, ErrBadName) {
				t.Errorf("Open(%q): %v; want ErrBadName", name, err)
			}
			if err := d.WriteFile(name, nil, 0o644); !errors.Is(err, ErrBadName) {
				t.Errorf("WriteFile(%q): %v; want ErrBadName", name, err)
			}
			if err := d.Remove(name); !errors.Is(err, ErrBadName) {
				t.Errorf("Remove(%q): %v; want ErrBadName", name, err)
			}
		}
		if err := d.Remove("."); !errors.Is(err, ErrBadName) {
			t.Errorf("Remove(.): %v; want ErrBadName", err)
		}
		untouched(t, outside)
	})
}

// A fifo is never waited on (the test would hang) and never opened.
func TestFifoRefused(t *testing.T) {
	both(t, func(t *testing.T) {
		d, _, _ := tree(t)
		if _, err := d.Open("fifo"); !errors.Is(err, ErrNotRegular) {
			t.Errorf("Open(fifo): %v; want ErrNotRegular", err)
		}
		if _, err := d.ReadFile("fifo", 10); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(fifo): %v; want ErrNotRegular", err)
		}
		if _, err := d.OpenFile("fifo", os.O_RDWR, 0); !errors.Is(err, ErrNotRegular) {
			t.Errorf("OpenFile(fifo, O_RDWR): %v; want ErrNotRegular", err)
		}
		if fi, err := d.Lstat("fifo"); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
			t.Errorf("Lstat(fifo) = %v, %v", fi, err)
		}
	})
}

// A second name of a file is refused for writing: its first may be the
// host's.
func TestHardLinkNotWritten(t *testing.T) {
	both(t, func(t *testing.T) {
		d, root, _ := tree(t)
		must(t, os.Link(filepath.Join(root, "d", "g"), filepath.Join(root, "hard")))
		if _, err := d.OpenFile("hard", os.O_WRONLY|os.O_TRUNC, 0); !errors.Is(err, ErrLinked) {
			t.Errorf("OpenFile(hard, O_WRONLY): %v; want ErrLinked", err)
		}
		if b, err := d.ReadFile("hard", 10); err != nil || string(b) != "g" {
			t.Errorf("ReadFile(hard) = %q, %v", b, err)
		}
	})
}

func TestReadDir(t *testing.T) {
	both(t, func(t *testing.T) {
		d, _, _ := tree(t)
		sub, err := d.Sub("d")
		must(t, err)
		defer sub.Close()
		ents, err := sub.ReadDir(-1)
		if err != nil || len(ents) != 1 || ents[0].Name() != "g" {
			t.Fatalf("ReadDir = %v, %v", ents, err)
		}
		if fi, err := ents[0].Info(); err != nil || fi.Size() != 1 {
			t.Errorf("Info = %v, %v", fi, err)
		}
	})
}

// A mount below the Dir is not crossed (a sandbox's mounts never reach
// the host, but a Dir never relies on it).
func TestMountNotCrossed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	both(t, func(t *testing.T) {
		d, root, _ := tree(t)
		mnt := filepath.Join(root, "d")
		must(t, unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"))
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		must(t, os.WriteFile(filepath.Join(mnt, "m"), []byte("m"), 0o644))
		if _, err := d.ReadFile("d/m", 10); !errors.Is(err, unix.EXDEV) {
			t.Errorf("ReadFile(d/m) across a mount: %v; want EXDEV", err)
		}
		if err := d.WriteFile("d/n", nil, 0o644); !errors.Is(err, unix.EXDEV) {
			t.Errorf("WriteFile(d/n) across a mount: %v; want EXDEV", err)
		}
	})
}

// On this kernel openat2 is there: the walk is the fallback, not the rule.
func TestOpenat2Used(t *testing.T) {
	d, _, _ := tree(t)
	if _, err := d.ReadFile("f", 10); err != nil || noOpenat2.Load() {
		t.Skipf("openat2 unavailable here (%v): every test above ran the walk twice", err)
	}
}

// A magic link (/proc's fd, root, cwd, exe) is never gone through, even
// from a Dir opened on this process's /proc directory itself.
func TestMagicLinksRefused(t *testing.T) {
	both(t, func(t *testing.T) {
		d, err := Open("/proc/" + strconv.Itoa(os.Getpid()))
		must(t, err)
		defer d.Close()
		for _, name := range []string{"root/etc/passwd", "cwd", "exe", "fd/0", "root"} {
			if f, err := d.Open(name); err == nil {
				f.Close()
				t.Errorf("Open(%s) went through a magic link", name)
			}
			if _, err := d.Stat(name); err == nil {
				t.Errorf("Stat(%s) went through a magic link", name)
			}
		}
		if _, err := d.ReadFile("status", 1<<20); err != nil {
			t.Errorf("ReadFile(status), no link on its way: %v", err)
		}
	})
}

// TestRemoveAll: a tree below the Dir goes whole, its links removed and
// never followed (the host file and the directory a link names stay), a
// missing name is no error, a link in the path to it is refused, and a
// tree nested past maxRemoveDepth is an error, not a walk without end.
func TestRemoveAll(t *testing.T) {
	both(t, func(t *testing.T) {
		d, root, outside := tree(t)
		must(t, d.MkdirAll("x/y/z", 0o755))
		must(t, d.WriteFile("x/y/z/file", []byte("a"), 0o644))
		for i := range 600 {
			must(t, d.WriteFile("x/y/many"+strconv.Itoa(i), nil, 0o644))
		}
		must(t, os.Symlink(outside, filepath.Join(root, "x", "y", "out")))
		must(t, os.Symlink(filepath.Join(root, "d"), filepath.Join(root, "x", "in")))
		must(t, d.RemoveAll("x"))
		if _, err := os.Lstat(filepath.Join(root, "x")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("x left: %v", err)
		}
		if _, err := os.Stat(filepath.Join(root, "d", "g")); err != nil {
			t.Errorf("d/g, named by a removed link, is gone: %v", err)
		}
		untouched(t, outside)
		must(t, d.RemoveAll("x"))
		if err := d.RemoveAll("dlink/secret"); err == nil {
			t.Error("RemoveAll through a link removed")
		}
		must(t, d.RemoveAll("dlink"))
		untouched(t, outside)

		deep := strings.Repeat("n/", maxRemoveDepth+2)
		must(t, d.MkdirAll(strings.TrimSuffix(deep, "/"), 0o755))
		if err := d.RemoveAll("n"); err == nil {
			t.Errorf("a tree %d deep removed", maxRemoveDepth+2)
		}
	})
}
