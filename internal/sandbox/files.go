package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/workspace"
)

// File is one entry of a directory list.
type File = runapi.FileInfo

// MaxList bounds the entries a directory list returns, its depth
// included; MaxListDepth bounds that depth.
const (
	MaxList      = 10000
	MaxListDepth = 64
)

// The writable places of a live sandbox whose files the host reaches:
// each a tmpfs the host made and mounted in the sandbox (its workspace,
// and its /tmp, runner.Live.Tmp). The rest of what it sees is read-only
// (its image's root) or its own (/dev/shm, /proc), out of the host's
// reach.
const (
	workspaceDir = "/workspace"
	tmpDir       = "/tmp"
)

// ErrBadPath is wrapped by the refusal of a file path outside the
// sandbox's writable places that the host reaches.
var ErrBadPath = errkind.New(errkind.Invalid, "not a path in the sandbox's /workspace or /tmp (relative to /workspace, or absolute in one of them; no \"..\")")

// place is one writable place of a sandbox and a name in it.
type place struct {
	mount string               // where the sandbox sees it
	ws    *workspace.Workspace // the host's tmpfs of it
	dir   *safefs.Dir          // its root, as resolve found it
	rel   string               // the name below it ("." for it)
}

// abs is the name as the sandbox sees it.
func (p place) abs() string { return path.Join(p.mount, p.rel) }

// owner is the uid and gid the host gives what it makes in the place:
// the sandbox's, or in a kept session's workspace the store's owner (the
// sandbox sees it as its own through an id-mapped mount).
func (s *Sandbox) owner(p place) (uid, gid int) {
	if p.mount == workspaceDir {
		return s.live.FileUID, s.live.FileGID
	}
	return s.live.UID, s.live.UID
}

// root is the place's root, resolved link-safe below.
func (p place) root() *safefs.Dir { return p.dir }

// resolve is name, relative to /workspace or absolute in one of the
// sandbox's writable places, as that place and a name below it. A name
// holding ".." or NUL, or outside those places, is refused.
func (s *Sandbox) resolve(name string) (place, error) {
	if s.ended() {
		return place{}, ErrEnded
	}
	bad := func() (place, error) { return place{}, fmt.Errorf("%w: %q", ErrBadPath, name) }
	if strings.ContainsRune(name, 0) || slices.Contains(strings.Split(name, "/"), "..") {
		return bad()
	}
	mount, ws, rest := workspaceDir, s.live.Workspace, name
	if path.IsAbs(name) {
		clean := path.Clean(name)
		var ok bool
		for _, m := range []struct {
			dir string
			ws  *workspace.Workspace
		}{{workspaceDir, s.live.Workspace}, {tmpDir, s.live.Tmp}} {
			if r, cut := strings.CutPrefix(clean, m.dir); cut && (r == "" || r[0] == '/') && m.ws != nil {
				mount, ws, rest, ok = m.dir, m.ws, strings.TrimPrefix(r, "/"), true
				break
			}
		}
		if !ok {
			return bad()
		}
	}
	// Its root is nil once the sandbox's tear-down closed it.
	dir := ws.Root()
	if dir == nil {
		return place{}, ErrEnded
	}
	if rest == "" || rest == "." {
		return place{mount: mount, ws: ws, dir: dir, rel: "."}, nil
	}
	rest = path.Clean(rest)
	if !fs.ValidPath(rest) {
		return bad()
	}
	return place{mount: mount, ws: ws, dir: dir, rel: rest}, nil
}

// resolveBelow is resolve, refusing a place's root itself: what op
// cannot do to a whole place.
func (s *Sandbox) resolveBelow(name, op string) (place, error) {
	p, err := s.resolve(name)
	if err == nil && p.rel == "." {
		err = errkind.Mark(errkind.Invalid, fmt.Errorf("%s %q: it is the sandbox's %s itself", op, name, p.mount))
	}
	return p, err
}

// ReadFile returns the sandbox's regular file name, at most max bytes
// (a longer one is refused), never through a link.
func (s *Sandbox) ReadFile(name string, max int64) ([]byte, error) {
	p, err := s.resolve(name)
	if err != nil {
		return nil, err
	}
	f, err := p.ws.OpenRegular(p.rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, errkind.Mark(errkind.TooLarge, fmt.Errorf("%q is larger than %d bytes", name, max))
	}
	return b, nil
}

// WriteFile writes the sandbox's file name from the size bytes of r,
// owned by the sandbox's user, its missing parents made so too,
// replacing what is there (a link is replaced, never written through).
func (s *Sandbox) WriteFile(name string, r io.Reader, size int64) error {
	p, err := s.resolveBelow(name, "writing")
	if err != nil {
		return err
	}
	uid, gid := s.owner(p)
	return p.ws.WriteFrom(p.rel, r, size, uid, gid)
}

// Remove removes the sandbox's file or directory name, and what is
// under it, never following a link.
func (s *Sandbox) Remove(name string) error {
	p, err := s.resolveBelow(name, "removing")
	if err != nil {
		return err
	}
	// RemoveAll takes a name that is not there: a remove of one is.
	if _, err := p.root().Lstat(p.rel); err != nil {
		return err
	}
	return p.ws.RemoveAll(p.rel)
}

// Stat describes the sandbox's file name: a link is described (its
// target given), never followed.
func (s *Sandbox) Stat(name string) (File, error) {
	p, err := s.resolve(name)
	if err != nil {
		return File{}, err
	}
	fi, err := p.root().Lstat(p.rel)
	if err != nil {
		return File{}, err
	}
	return fileOf(p, fi), nil
}

// MakeDir makes the sandbox's directory name and its missing parents,
// owned by its user; created is false when name was a directory already.
// A link on the way is an error, never followed.
func (s *Sandbox) MakeDir(name string) (created bool, err error) {
	p, err := s.resolveBelow(name, "making")
	if err != nil {
		return false, err
	}
	uid, _ := s.owner(p)
	return mkdirAll(p.root(), p.rel, uid)
}

// mkdirAll makes the directory rel below root and its missing parents,
// each owned by uid; created says whether rel itself was made.
func mkdirAll(root *safefs.Dir, rel string, uid int) (created bool, err error) {
	comps := strings.Split(rel, "/")
	for i := range comps {
		d := strings.Join(comps[:i+1], "/")
		err := root.Mkdir(d, 0o755)
		switch {
		case err == nil:
			if err := root.Lchown(d, uid, uid); err != nil {
				return false, err
			}
			created = true
			continue
		case !errors.Is(err, fs.ErrExist):
			return false, err
		}
		// There already: it must be a directory, not a link to one.
		fi, err := root.Lstat(d)
		if err != nil {
			return false, err
		}
		if !fi.IsDir() {
			return false, errkind.Mark(errkind.Invalid, fmt.Errorf("%q is there and not a directory", d))
		}
		created = false
	}
	return created, nil
}

// Rename moves the sandbox's file or directory from to to, within one
// of its writable places (its missing parents made), replacing what was
// at to as rename(2) does (a link itself, never what it names).
func (s *Sandbox) Rename(from, to string) error {
	src, err := s.resolveBelow(from, "moving")
	if err != nil {
		return err
	}
	dst, err := s.resolveBelow(to, "moving onto")
	if err != nil {
		return err
	}
	if src.mount != dst.mount {
		return errkind.Mark(errkind.Invalid, fmt.Errorf("moving %q to %q: %s and %s are two file systems; a move stays in one", from, to, src.mount, dst.mount))
	}
	if _, err := src.root().Lstat(src.rel); err != nil {
		return err
	}
	if dir := path.Dir(dst.rel); dir != "." {
		dstUID, _ := s.owner(dst)
		if _, err := mkdirAll(dst.root(), dir, dstUID); err != nil {
			return err
		}
	}
	return src.root().Rename(src.rel, dst.rel)
}

// List lists the sandbox's directory name (at most MaxList entries),
// never through a link.
func (s *Sandbox) List(name string) ([]File, error) { return s.ListDepth(name, 1) }

// ListDepth lists the sandbox's directory name and, depth levels down,
// the directories in it (1: its own entries alone; at most
// MaxListDepth), each directory's entries by name, followed by theirs:
// at most MaxList entries in all. A link is listed, never followed, and
// no mount is crossed.
func (s *Sandbox) ListDepth(name string, depth int) ([]File, error) {
	if depth < 1 || depth > MaxListDepth {
		return nil, errkind.Mark(errkind.Invalid, fmt.Errorf("a list's depth %d: it is 1 to %d", depth, MaxListDepth))
	}
	p, err := s.resolve(name)
	if err != nil {
		return nil, err
	}
	dir, err := p.root().Sub(p.rel)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	out := []File{}
	return out, listInto(dir, p, depth, &out)
}

// listInto appends dir's entries (dir is p's), and those of its
// directories depth-1 levels down, to out, within MaxList.
func listInto(dir *safefs.Dir, p place, depth int, out *[]File) error {
	ents, err := dir.ReadDir(MaxList - len(*out))
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range ents {
		if len(*out) >= MaxList {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			continue // gone since
		}
		ep := place{mount: p.mount, ws: p.ws, dir: p.dir, rel: path.Join(p.rel, e.Name())}
		*out = append(*out, fileOf(ep, fi))
		if depth <= 1 || !fi.IsDir() {
			continue
		}
		sub, err := dir.Sub(e.Name())
		if err != nil {
			continue // gone, or replaced by a link since
		}
		err = listInto(sub, ep, depth-1, out)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// fileOf is fi, of p, as a list or a stat shows it.
func fileOf(p place, fi fs.FileInfo) File {
	f := File{Name: fi.Name(), Path: p.abs(), Size: fi.Size(), Mode: fmt.Sprintf("%04o", fi.Mode().Perm()), MTime: fi.ModTime().UTC()}
	if p.rel == "." {
		f.Name = path.Base(p.mount)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		f.UID, f.GID = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		f.Type = "file"
	case fi.IsDir():
		f.Type = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		f.Type = "symlink"
		if t, err := p.root().Readlink(p.rel); err == nil {
			f.Target = t
		}
	default:
		f.Type = "other"
	}
	return f
}
