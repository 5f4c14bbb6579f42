package session

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/task"
)

// Bounds on host-side access to a session's files.
const (
	MaxFileBytes = 16 << 20 // one file read or written
	MaxList      = 10000    // entries a listing visits (listed or not)
	MaxListDepth = 32       // directory levels a listing descends
)

// ErrBadPath is wrapped by the refusal of a file name (errkind.Invalid).
var ErrBadPath = errkind.New(errkind.Invalid, "bad file name")

// ErrTooLarge is wrapped when a file is over MaxFileBytes, or the session
// has no room for it (errkind.TooLarge).
var ErrTooLarge = errkind.New(errkind.TooLarge, "file too large")

// File is one entry of a session's listing. Names are workspace-relative
// and may hold any byte a program put there (JSON escapes them).
type File struct {
	Name  string    `json:"name"`
	Type  string    `json:"type"` // file, dir, symlink, fifo, socket, device, other
	Size  int64     `json:"size"`
	MTime time.Time `json:"mtime"`
}

// Listing is a session's files, cut at MaxList entries or MaxListDepth.
type Listing struct {
	Files     []File `json:"files"`
	Truncated bool   `json:"truncated"`
}

// withRoot takes session id, mounts its disk and runs fn with its root
// held open (safefs): no name fn opens through it resolves outside the
// session or through a link. The disk is unmounted and the session
// released afterwards.
func (s *Store) withRoot(id string, fn func(*safefs.Dir) error) (err error) {
	l, err := s.Lock(id)
	if err != nil {
		return err
	}
	defer l.Release()
	mp := filepath.Join(s.mnt, id)
	if err := l.Mount(mp); err != nil {
		return err
	}
	defer func() {
		if uerr := unmount(mp); err == nil {
			err = uerr
		}
	}()
	root, err := safefs.Open(mp)
	if err != nil {
		return fmt.Errorf("opening session: %w", err)
	}
	defer root.Close()
	return fn(root)
}

// Files lists session id's files breadth first (a directory's entries
// before those of its subdirectories), visiting at most MaxList entries
// and MaxListDepth levels. Symlinks are listed, never followed.
func (s *Store) Files(id string) (*Listing, error) {
	out := &Listing{Files: []File{}}
	err := s.withRoot(id, func(root *safefs.Dir) error {
		type dir struct {
			name  string
			depth int
		}
		queue := []dir{{".", 0}}
		visited := 0
		for len(queue) > 0 {
			d := queue[0]
			queue = queue[1:]
			subdirs, err := listDir(root, d.name, &visited, out)
			if err != nil {
				return err
			}
			if out.Truncated {
				return nil
			}
			for _, sd := range subdirs {
				if d.depth+1 >= MaxListDepth {
					out.Truncated = true
					break
				}
				queue = append(queue, dir{sd, d.depth + 1})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// listDir lists the entries of dir into out, until visited reaches
// MaxList, and returns its subdirectories.
func listDir(root *safefs.Dir, dir string, visited *int, out *Listing) ([]string, error) {
	d, err := root.Sub(dir)
	if err != nil {
		return nil, fmt.Errorf("listing %q: %w", dir, err)
	}
	defer d.Close()
	var subdirs []string
	for {
		// In chunks: a directory of a million names is read only as far
		// as the bound.
		ents, err := d.ReadDir(256)
		for _, e := range ents {
			if *visited >= MaxList {
				out.Truncated = true
				return nil, nil
			}
			*visited++
			name := path.Join(dir, e.Name())
			fi, lerr := root.Lstat(name)
			if lerr != nil {
				continue // gone meanwhile
			}
			out.Files = append(out.Files, File{Name: name, Type: fileType(fi.Mode()), Size: fi.Size(), MTime: fi.ModTime().UTC()})
			if fi.IsDir() {
				subdirs = append(subdirs, name)
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(ents) == 0) {
			return subdirs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing %q: %w", dir, err)
		}
	}
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "other"
}

// ReadFile returns the content of the regular file name in session id; a
// symlink, fifo, device or directory is refused, and so is a file over
// MaxFileBytes.
func (s *Store) ReadFile(id, name string) ([]byte, error) {
	if reason := task.CheckRelPath(name); reason != "" {
		return nil, fmt.Errorf("%w: %s", ErrBadPath, reason)
	}
	var data []byte
	err := s.withRoot(id, func(root *safefs.Dir) error {
		// A link is refused, not followed (even inside); a fifo never
		// blocks the open, and is refused.
		f, err := root.Open(name)
		if errors.Is(err, safefs.ErrNotRegular) {
			kind := "other"
			if fi, lerr := root.Lstat(name); lerr == nil {
				kind = fileType(fi.Mode())
			}
			return fmt.Errorf("%w: %q is not a regular file (%s)", ErrBadPath, name, kind)
		}
		if err != nil {
			return fmt.Errorf("%w: %q: %s", ErrBadPath, name, why(root, name, err))
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: %q is not a regular file (%s)", ErrBadPath, name, fileType(st.Mode()))
		}
		if st.Size() > MaxFileBytes {
			return fmt.Errorf("%w: %q is %d bytes, more than %d", ErrTooLarge, name, st.Size(), MaxFileBytes)
		}
		data, err = io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
		if err == nil && len(data) > MaxFileBytes {
			return fmt.Errorf("%w: %q is more than %d bytes", ErrTooLarge, name, MaxFileBytes)
		}
		return err
	})
	return data, err
}

// WriteFile writes the file name in session id from r (at most
// MaxFileBytes), owned by the sandbox's user, replacing what was there (a
// symlink is replaced, never written through). Parent directories are
// created.
func (s *Store) WriteFile(id, name string, r io.Reader) error {
	if reason := task.CheckRelPath(name); reason != "" {
		return fmt.Errorf("%w: %s", ErrBadPath, reason)
	}
	return s.withRoot(id, func(root *safefs.Dir) error {
		if dir := path.Dir(name); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("%w: %q: %s", ErrBadPath, dir, why(root, dir, err))
			}
			for d := dir; d != "."; d = path.Dir(d) {
				if err := root.Lchown(d, s.uid, s.gid); err != nil {
					return err
				}
			}
		}
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %q: %s", ErrBadPath, name, why(root, name, err))
		}
		f, err := root.Create(name, 0o644)
		if err != nil {
			return fmt.Errorf("%w: %q: %s", ErrBadPath, name, why(root, name, err))
		}
		n, err := io.Copy(f, io.LimitReader(r, MaxFileBytes+1))
		if err == nil && n > MaxFileBytes {
			err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, MaxFileBytes)
		}
		if err == nil {
			err = f.Chown(s.uid, s.gid)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			root.Remove(name)
			if errors.Is(err, unix.ENOSPC) {
				return fmt.Errorf("%w: the session is full (sessions.max_bytes)", ErrTooLarge)
			}
			return err
		}
		return nil
	})
}

// why says, in the client's terms, why name could not be opened or made
// in the session: a symbolic link on its way or at its end (never
// followed), a file where a directory should be, nothing there. It names
// the session's paths only, never a host path or a system call.
func why(root *safefs.Dir, name string, err error) string {
	parts := strings.Split(name, "/")
	var last fs.FileInfo // name's own, when it exists
walk:
	for i := range parts {
		sub := path.Join(parts[:i+1]...)
		fi, lerr := root.Lstat(sub)
		last = fi
		switch {
		case errors.Is(lerr, fs.ErrNotExist) && i < len(parts)-1:
			return fmt.Sprintf("directory %q does not exist", sub)
		case lerr != nil:
			break walk // err says why, below
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Sprintf("%q is a symbolic link, which is never followed", sub)
		case i < len(parts)-1 && !fi.IsDir():
			return fmt.Sprintf("%q is not a directory", sub)
		}
	}
	var errno syscall.Errno
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "no such file"
	case (errors.Is(err, fs.ErrExist) || errors.Is(err, unix.ENOTDIR)) && last != nil && !last.IsDir():
		// Making directories: a file has the name.
		return fmt.Sprintf("%q is not a directory", name)
	case errors.Is(err, fs.ErrExist):
		return "something else is in its place"
	case errors.As(err, &errno):
		return errno.Error()
	}
	return "it cannot be reached in the session"
}
