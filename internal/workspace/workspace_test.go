package workspace

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/test/testenv"
)

func create(t *testing.T, size int64, files map[string][]byte) *Workspace {
	t.Helper()
	testenv.RequireRoot(t)
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

// TestCreateRefusesFilesOverSize: a file that does not fit is refused as
// too large (413 on serve), naming the file as the task named it and the
// workspace's size, never the host path of the workspace.
func TestCreateRefusesFilesOverSize(t *testing.T) {
	testenv.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "ws")
	_, err := Create(dir, 64<<10, 65534, 65534, map[string][]byte{"big": make([]byte, 1<<20)})
	if err == nil || !strings.Contains(err.Error(), "workspace size") || !strings.Contains(err.Error(), `"big"`) ||
		!strings.Contains(err.Error(), "65536") || !errors.Is(err, ErrNoRoom) || errkind.Of(err) != errkind.TooLarge {
		t.Fatalf("Create with 1 MiB in a 64 KiB workspace: err = %v; want the file, the workspace size, too large", err)
	}
	if strings.Contains(err.Error(), dir) {
		t.Errorf("the refusal names the workspace's host path: %v", err)
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

	os.Symlink("/etc/passwd", filepath.Join(w.Dir, "p"))

	got, rep, err := w.Collect([]string{"out/*.png", "report.md", "etc/passwd", "inner.md", "missing.txt", "p"}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// A pattern naming a symlink exactly lists it, as a wildcard does.
	if f, ok := got["p"]; !ok || f.Error == "" || f.ContentBase64 != "" {
		t.Errorf("p (a symlink named exactly) = %+v, listed %v; want listed with an error", f, ok)
	}
	if want := []string{"etc/passwd", "missing.txt"}; !slices.Equal(rep.Unmatched, want) || rep.Cut != "" {
		t.Errorf("report = %+v; want unmatched %q and no cut", rep, want)
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
	testenv.RequireRoot(t)
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

// collectIn runs Collect on a workspace holding what setup made, and
// fails past a second: every walk is bounded well below that.
func collectIn(t *testing.T, w *Workspace, globs []string, lim Limits) (map[string]result.File, *result.Collect) {
	t.Helper()
	start := time.Now()
	got, rep, err := w.Collect(globs, lim)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Collect took %v", d)
	}
	return got, rep
}

// TestCollectSymlinkLoop: 1000 links d/lNNN -> . made d/*/*/* match 10^9
// paths through fs.Glob. A link is never descended into: the walk looks at
// each entry once.
func TestCollectSymlinkLoop(t *testing.T) {
	w := create(t, 8<<20, nil)
	d := filepath.Join(w.Dir, "d")
	os.Mkdir(d, 0o755)
	for i := range 1000 {
		if err := os.Symlink(".", filepath.Join(d, fmt.Sprintf("l%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	got, rep := collectIn(t, w, []string{"d/*/*/*", "d/l0*/x"}, Limits{})
	if len(got) != 0 || !slices.Equal(rep.Unmatched, []string{"d/*/*/*", "d/l0*/x"}) || rep.Cut != "" {
		t.Errorf("got %d files, report %+v; want none and both patterns unmatched", len(got), rep)
	}
	got, rep = collectIn(t, w, []string{"d/*"}, Limits{})
	if len(got) != 1000 || got["d/l123"].Error == "" || rep.Cut != "" {
		t.Errorf("d/*: %d files (d/l123 %+v), report %+v; want the 1000 links listed with errors", len(got), got["d/l123"], rep)
	}
}

func TestCollectBounds(t *testing.T) {
	w := create(t, 8<<20, nil)
	for i := range 50 {
		sub := filepath.Join(w.Dir, "t", fmt.Sprintf("%02d", i))
		os.MkdirAll(sub, 0o755)
		for j := range 40 {
			os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%02d.txt", j)), []byte("0123456789"), 0o644)
		}
	}
	for _, tc := range []struct {
		name  string
		globs []string
		lim   Limits
		cut   string
		files int
	}{
		{"entries", []string{"t/*/*.png"}, Limits{Entries: 500}, "500 directory entries looked at", 0},
		{"files", []string{"t/*/*.txt"}, Limits{Files: 30}, "30 files", 30},
		{"time", []string{"t/*/*.png"}, Limits{Time: time.Nanosecond}, "1ns spent", 0},
		{"none", []string{"t/*/*.txt"}, Limits{Files: 5000}, "", 2000},
	} {
		got, rep := collectIn(t, w, tc.globs, tc.lim)
		if rep.Cut != tc.cut || len(got) != tc.files {
			t.Errorf("%s: %d files, report %+v; want %d files, cut %q", tc.name, len(got), rep, tc.files, tc.cut)
		}
		if tc.cut != "" && len(rep.Unmatched) != 0 {
			t.Errorf("%s: a cut walk reported %q unmatched", tc.name, rep.Unmatched)
		}
	}
	// Bytes: the budget is shared; files past it are listed, truncated.
	got, _ := collectIn(t, w, []string{"t/00/*"}, Limits{Bytes: 25})
	var kept int
	for _, f := range got {
		b, _ := base64.StdEncoding.DecodeString(f.ContentBase64)
		kept += len(b)
	}
	if kept != 25 || len(got) != 40 || !got["t/00/f39.txt"].Truncated {
		t.Errorf("bytes: kept %d bytes of %d files; want 25 bytes of 40", kept, len(got))
	}
}

// Names that are not valid UTF-8 became the same JSON key ("r\ufffd"):
// they get escaped keys that differ, and their exact bytes.
func TestCollectNonUTF8Names(t *testing.T) {
	w := create(t, 1<<20, nil)
	for _, n := range []string{"r\xff", "r\xfe", `r\xff`} {
		os.WriteFile(filepath.Join(w.Dir, n), []byte(n), 0o644)
	}
	got, _ := collectIn(t, w, []string{"r*"}, Limits{})
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]result.File
	json.Unmarshal(b, &back)
	if len(back) != 3 {
		t.Fatalf("3 files became %d JSON keys: %s", len(back), b)
	}
	seen := map[string]bool{}
	for key, f := range back {
		name := key
		if f.NameBase64 != "" {
			raw, _ := base64.StdEncoding.DecodeString(f.NameBase64)
			name = string(raw)
			if !utf8.ValidString(key) || key == name {
				t.Errorf("escaped key %q for %q", key, name)
			}
		}
		content, _ := base64.StdEncoding.DecodeString(f.ContentBase64)
		if string(content) != name {
			t.Errorf("key %q (name %q) holds %q", key, name, content)
		}
		seen[name] = true
	}
	if !seen["r\xff"] || !seen["r\xfe"] || !seen[`r\xff`] {
		t.Errorf("names back: %v", seen)
	}
	if _, ok := back[`r\xff (2)`]; !ok {
		t.Errorf("the escaped key taken by a real name did not move aside: %s", b)
	}
}

// TestNoLinkFollowedInside: a link the program left in its workspace is
// never gone through, even to a directory of the workspace itself: files
// written into a kept workspace whose parent is such a link fail, and a
// pattern naming a path through one matches nothing.
func TestNoLinkFollowedInside(t *testing.T) {
	w := create(t, 1<<20, nil)
	os.Mkdir(filepath.Join(w.Dir, "real"), 0o755)
	os.WriteFile(filepath.Join(w.Dir, "real", "f"), []byte("f"), 0o644)
	os.Symlink("real", filepath.Join(w.Dir, "via"))
	os.Symlink("real/f", filepath.Join(w.Dir, "leaf"))
	kept, err := Adopt(w.Dir, 1<<20, 65534, 65534, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.root.Close()
	for _, name := range []string{"via/new", "via/deeper/new"} {
		if err := kept.Write(map[string][]byte{name: []byte("x")}, 65534, 65534); err == nil {
			t.Errorf("writing %s went through the link", name)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(w.Dir, "real")); len(ents) != 1 {
		t.Errorf("real/ holds %d entries; want its one file", len(ents))
	}
	// A file written over a link replaces the link, not what it names.
	if err := kept.Write(map[string][]byte{"leaf": []byte("new")}, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(w.Dir, "real", "f")); string(b) != "f" {
		t.Errorf("real/f now holds %q", b)
	}
	got, rep := collectIn(t, w, []string{"via/f", "via/*"}, Limits{})
	if len(got) != 0 || !slices.Equal(rep.Unmatched, []string{"via/f", "via/*"}) {
		t.Errorf("collect through a link: %v, %+v; want nothing", got, rep)
	}
}
