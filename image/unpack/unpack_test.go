package unpack_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/image/unpack"
	"github.com/agentrun/agentrun/test/testenv"
)

// sandbox is a temp dir holding the unpack root next to a canary tree
// that no layer may change.
type sandbox struct {
	base, root, outside string
	before              string // hash of outside
	etcPasswd           []byte
}

func newSandbox(t testing.TB) *sandbox {
	t.Helper()
	base := t.TempDir()
	s := &sandbox{base: base, root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	if err := os.Mkdir(s.root, 0o700); err != nil {
		t.Fatal(err)
	}
	imagetest.WriteTree(t, s.outside, map[string]string{
		"passwd":     "canary-passwd\n",
		"etc/passwd": "canary-etc\n",
		"x":          "canary-x\n",
		"empty/":     "",
	})
	s.before = imagetest.HashTree(t, s.outside)
	s.etcPasswd, _ = os.ReadFile("/etc/passwd")
	return s
}

// check fails the test if anything outside the root changed.
func (s *sandbox) check(t testing.TB) {
	t.Helper()
	if got := imagetest.HashTree(t, s.outside); got != s.before {
		t.Fatalf("canary tree outside the root changed")
	}
	ents, err := os.ReadDir(s.base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "root" && e.Name() != "outside" {
			t.Fatalf("unpack wrote %q next to the root", e.Name())
		}
	}
	if got, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(got, s.etcPasswd) {
		t.Fatalf("/etc/passwd changed")
	}
	for _, p := range []string{"/etc/agentrun-canary", "/agentrun-canary", "/tmp/agentrun-canary"} {
		if _, err := os.Lstat(p); err == nil {
			os.Remove(p)
			t.Fatalf("unpack wrote %s", p)
		}
	}
}

func (s *sandbox) apply(t testing.TB, limits unpack.Limits, layers ...[]byte) (*unpack.Unpacker, error) {
	t.Helper()
	r, err := os.OpenRoot(s.root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	u := unpack.New(r, limits)
	for i, l := range layers {
		if err := u.Layer(context.Background(), bytes.NewReader(l)); err != nil {
			return u, err
		}
		_ = i
	}
	return u, nil
}

func lstat(t *testing.T, p string) fs.FileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("lstat: %v", err)
	}
	return fi
}

func TestHostileLayers(t *testing.T) {
	nt := imagetest.NewTar
	tests := []struct {
		name    string
		layers  func(t *testing.T) [][]byte
		wantErr error // nil: applied, then verify runs
		verify  func(t *testing.T, root string, u *unpack.Unpacker)
	}{
		{
			name:    "dotdot name",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).File("../x", "pwned", 0o644).Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name:    "dotdot inside name",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).File("a/../../x", "pwned", 0o644).Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name:    "absolute name",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).File("/agentrun-canary", "pwned", 0o644).Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "absolute symlink then file through it",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "/etc").File("a/agentrun-canary", "pwned", 0o644).Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "absolute symlink then passwd through it, across layers",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "/etc").Bytes(), nt(t).File("a/passwd", "pwned", 0o644).Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "relative escaping symlink then file",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "../../..").File("a/agentrun-canary", "pwned", 0o644).Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "relative symlink to sibling canary then overwrite",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "../outside").File("a/passwd", "pwned", 0o644).Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "symlinked dir then mkdir through it",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "../outside").Dir("a/sub/", 0o755).Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "whiteout through escaping symlink",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "../outside").Bytes(), nt(t).Whiteout("a", "x").Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "opaque whiteout through escaping symlink",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("a", "../outside").Bytes(), nt(t).File("a/.wh..wh..opq", "", 0o644).Bytes()}
			},
			verify: func(t *testing.T, root string, _ *unpack.Unpacker) {}, // neutralised: the canary check is the test
		},
		{
			name: "file replaces symlink, same layer",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("passwd", "../outside/passwd").File("passwd", "mine", 0o644).Bytes()}
			},
			verify: func(t *testing.T, root string, _ *unpack.Unpacker) {
				fi := lstat(t, filepath.Join(root, "passwd"))
				if !fi.Mode().IsRegular() {
					t.Fatalf("passwd mode = %v; want regular file", fi.Mode())
				}
				if b, _ := os.ReadFile(filepath.Join(root, "passwd")); string(b) != "mine" {
					t.Fatalf("passwd = %q; want %q", b, "mine")
				}
			},
		},
		{
			name: "file replaces absolute symlink, next layer",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Dir("etc/", 0o755).Symlink("etc/passwd", "/etc/passwd").Bytes(),
					nt(t).File("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644).Bytes()}
			},
			verify: func(t *testing.T, root string, _ *unpack.Unpacker) {
				if fi := lstat(t, filepath.Join(root, "etc/passwd")); !fi.Mode().IsRegular() {
					t.Fatalf("etc/passwd mode = %v; want regular file", fi.Mode())
				}
			},
		},
		{
			name: "absolute symlink kept as data",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("localtime", "/usr/share/zoneinfo/UTC").Bytes()}
			},
			verify: func(t *testing.T, root string, _ *unpack.Unpacker) {
				if got, _ := os.Readlink(filepath.Join(root, "localtime")); got != "/usr/share/zoneinfo/UTC" {
					t.Fatalf("readlink = %q", got)
				}
			},
		},
		{
			name:    "hardlink to absolute path",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).Link("x", "/etc/passwd").Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name:    "hardlink to dotdot path",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).Link("x", "../../outside").Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name:    "hardlink to sibling canary",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).Link("x", "../outside/passwd").Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "hardlink through escaping symlink",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Symlink("d", "../outside").Link("x", "d/passwd").Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "hardlink within root",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).File("bin/a", "A", 0o755).Link("bin/b", "bin/a").Bytes()}
			},
			verify: func(t *testing.T, root string, _ *unpack.Unpacker) {
				a, b := lstat(t, filepath.Join(root, "bin/a")), lstat(t, filepath.Join(root, "bin/b"))
				if !os.SameFile(a, b) {
					t.Fatalf("bin/b is not a hardlink of bin/a")
				}
			},
		},
		{
			name: "device node and fifo skipped",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Dir("dev/", 0o755).Device("dev/mem", 1, 1).Device("dev/null", 1, 3).Fifo("dev/fifo").Bytes()}
			},
			verify: func(t *testing.T, root string, u *unpack.Unpacker) {
				for _, n := range []string{"dev/mem", "dev/null", "dev/fifo"} {
					if _, err := os.Lstat(filepath.Join(root, n)); !errors.Is(err, fs.ErrNotExist) {
						t.Fatalf("%s exists (err %v); want skipped", n, err)
					}
				}
				if u.Skipped != 3 {
					t.Fatalf("Skipped = %d; want 3", u.Skipped)
				}
			},
		},
		{
			name: "setuid and setgid stripped, sticky kept",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).File("bin/su", "#!", 0o4755).File("bin/wall", "#!", 0o2755).Dir("tmp/", 0o1777).Bytes()}
			},
			verify: func(t *testing.T, root string, _ *unpack.Unpacker) {
				for _, n := range []string{"bin/su", "bin/wall"} {
					if m := lstat(t, filepath.Join(root, n)).Mode(); m&(fs.ModeSetuid|fs.ModeSetgid) != 0 || m.Perm() != 0o755 {
						t.Fatalf("%s mode = %v; want -rwxr-xr-x", n, m)
					}
				}
				if m := lstat(t, filepath.Join(root, "tmp")).Mode(); m&fs.ModeSticky == 0 {
					t.Fatalf("tmp mode = %v; want sticky", m)
				}
			},
		},
		{
			name:    "whiteout of dotdot",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).File(".wh...", "", 0o644).Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "whiteout of dotdot in subdir, as directory",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).Dir("x/", 0o755).Bytes(), nt(t).Dir("x/.wh.../", 0o755).Bytes()}
			},
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name:    "whiteout of nothing",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).File("x/.wh.", "", 0o644).Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name:    "entry replacing the root",
			layers:  func(t *testing.T) [][]byte { return [][]byte{nt(t).File(".", "x", 0o644).Bytes()} },
			wantErr: unpack.ErrUnsafeLayer,
		},
		{
			name: "entry count limit",
			layers: func(t *testing.T) [][]byte {
				b := nt(t)
				for i := 0; i < 20; i++ {
					b.Dir("d"+strings.Repeat("x", i)+"/", 0o755)
				}
				return [][]byte{b.Bytes()}
			},
			wantErr: unpack.ErrTooLarge,
		},
		{
			name: "byte limit on the stream, not the files",
			layers: func(t *testing.T) [][]byte {
				b := nt(t)
				for i := 0; i < 8; i++ {
					b.Header(&tar.Header{Typeflag: tar.TypeReg, Name: "f" + strings.Repeat("x", i),
						PAXRecords: map[string]string{"SCHILY.xattr.user.pad": strings.Repeat("p", 20_000)}}, nil)
				}
				return [][]byte{b.Bytes()}
			},
			wantErr: unpack.ErrTooLarge,
		},
		{
			name: "byte limit",
			layers: func(t *testing.T) [][]byte {
				return [][]byte{nt(t).File("big", strings.Repeat("z", 200_000), 0o644).Bytes()}
			},
			wantErr: unpack.ErrTooLarge,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			u, err := s.apply(t, unpack.Limits{MaxBytes: 100_000, MaxEntries: 10}, tc.layers(t)...)
			s.check(t)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("apply: err = %v; want %v", err, tc.wantErr)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("apply: %v", err)
			}
			tc.verify(t, s.root, u)
		})
	}
}

func TestWhiteouts(t *testing.T) {
	s := newSandbox(t)
	nt := imagetest.NewTar
	lower := nt(t).File("a/f", "1", 0o644).File("b/g", "2", 0o644).File("c/h", "3", 0o644).
		File("c/sub/deep", "4", 0o644).File("d/keep", "5", 0o644).File("e/old", "6", 0o644).Bytes()
	upper := nt(t).Whiteout("", "a").
		File("c/.wh..wh..opq", "", 0o644).File("c/new", "7", 0o644).
		File("d/sub/new", "8", 0o644).File("d/.wh..wh..opq", "", 0o644). // marker after the layer's own entries
		Whiteout("", "missing").
		File("e/.wh..wh.plnk", "", 0o644).
		Bytes()
	if _, err := s.apply(t, unpack.Limits{}, lower, upper); err != nil {
		t.Fatalf("apply: %v", err)
	}
	s.check(t)
	for p, want := range map[string]bool{
		"a": false, "b/g": true, "c/h": false, "c/sub": false, "c/new": true,
		"d/keep": false, "d/sub/new": true, "e/old": true, "e/.wh..wh.plnk": false, "c/.wh..wh..opq": false, ".wh.a": false,
	} {
		_, err := os.Lstat(filepath.Join(s.root, p))
		if got := err == nil; got != want {
			t.Errorf("%s exists = %v; want %v", p, got, want)
		}
	}
}

func TestReplaceTypes(t *testing.T) {
	s := newSandbox(t)
	nt := imagetest.NewTar
	lower := nt(t).File("f2d", "x", 0o644).Dir("d2f/", 0o755).File("d2f/child", "y", 0o644).Symlink("bin", "usr/bin").Dir("usr/bin/", 0o755).Bytes()
	upper := nt(t).Dir("f2d/", 0o755).File("d2f", "z", 0o600).File("bin/tool", "t", 0o755).Bytes()
	if _, err := s.apply(t, unpack.Limits{}, lower, upper); err != nil {
		t.Fatalf("apply: %v", err)
	}
	s.check(t)
	if !lstat(t, filepath.Join(s.root, "f2d")).IsDir() {
		t.Errorf("f2d is not a directory")
	}
	if m := lstat(t, filepath.Join(s.root, "d2f")).Mode(); !m.IsRegular() || m.Perm() != 0o600 {
		t.Errorf("d2f mode = %v; want -rw-------", m)
	}
	// A file through an in-root relative symlink lands at its target.
	if _, err := os.Stat(filepath.Join(s.root, "usr/bin/tool")); err != nil {
		t.Errorf("usr/bin/tool: %v", err)
	}
}

func TestOwnership(t *testing.T) {
	testenv.RequireRoot(t) // it chowns
	s := newSandbox(t)
	layer := imagetest.NewTar(t).
		Header(&tar.Header{Typeflag: tar.TypeDir, Name: "home/u/", Mode: 0o750, Uid: 1000, Gid: 1001}, nil).
		Owned("home/u/f", "x", 0o640, 1000, 1001).
		Header(&tar.Header{Typeflag: tar.TypeSymlink, Name: "home/u/l", Linkname: "/etc/shadow", Uid: 1000, Gid: 1001}, nil).
		Owned("bin/ping", "x", 0o4755, 0, 0).
		Bytes()
	if _, err := s.apply(t, unpack.Limits{}, layer); err != nil {
		t.Fatalf("apply: %v", err)
	}
	s.check(t)
	for _, n := range []string{"home/u", "home/u/f", "home/u/l"} {
		st := lstat(t, filepath.Join(s.root, n)).Sys().(*syscall.Stat_t)
		if st.Uid != 1000 || st.Gid != 1001 {
			t.Errorf("%s owner = %d:%d; want 1000:1001", n, st.Uid, st.Gid)
		}
	}
	if m := lstat(t, filepath.Join(s.root, "home/u")).Mode().Perm(); m != 0o750 {
		t.Errorf("home/u perm = %v; want 0750", m)
	}
	if st, _ := os.Stat("/etc/shadow"); st != nil {
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid == 1000 {
			t.Fatalf("/etc/shadow was chowned through the symlink")
		}
	}
}

// hostileSeeds are the fuzz seed corpus: the hostile cases as single tars.
func hostileSeeds(t testing.TB) [][]byte {
	nt := imagetest.NewTar
	return [][]byte{
		nt(t).File("../x", "p", 0o644).Bytes(),
		nt(t).File("/agentrun-canary", "p", 0o644).Bytes(),
		nt(t).Symlink("a", "/etc").File("a/agentrun-canary", "p", 0o644).Bytes(),
		nt(t).Symlink("a", "../../..").File("a/agentrun-canary", "p", 0o644).Bytes(),
		nt(t).Symlink("a", "../outside").File("a/passwd", "p", 0o644).Bytes(),
		nt(t).Symlink("passwd", "../outside/passwd").File("passwd", "mine", 0o644).Bytes(),
		nt(t).Link("x", "/etc/passwd").Link("y", "../../outside").Bytes(),
		nt(t).Device("null", 1, 3).Fifo("p").Bytes(),
		nt(t).File("su", "x", 0o4755).Bytes(),
		nt(t).File(".wh...", "", 0o644).Dir("x/.wh.../", 0o755).Bytes(),
		nt(t).Dir("c/", 0o755).File("c/f", "1", 0o644).File("c/.wh..wh..opq", "", 0o644).Whiteout("", "c").Bytes(),
		nt(t).Symlink("l", "l").File("l/x", "", 0o644).Bytes(),
	}
}

func FuzzUnpack(f *testing.F) {
	for _, seed := range hostileSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newSandbox(t)
		// Errors are expected; panics and writes outside are not.
		s.apply(t, unpack.Limits{MaxBytes: 1 << 20, MaxEntries: 200}, data)
		s.check(t)
	})
}
