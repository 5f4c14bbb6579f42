package safefs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Errors a Dir's methods wrap (in an *fs.PathError): test with errors.Is.
var (
	// ErrBadName is a name that is empty, absolute or holds "..".
	ErrBadName = errors.New("not a relative name without \"..\"")
	// ErrNotRegular is what a name opened that is neither a regular file
	// nor a directory (a fifo, a socket, a device node).
	ErrNotRegular = errors.New("not a regular file or a directory")
	// ErrTooLarge is a file ReadFile found past its bound.
	ErrTooLarge = errors.New("file past its size bound")
	// ErrLinked is a regular file with more than one name, opened to be
	// written: its other name may be anywhere on its file system.
	ErrLinked = errors.New("file has more than one link")
)

// resolve is every openat2 resolution's flags: beneath the Dir, no
// symbolic link, no magic link, no mount crossed.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// maxRetries bounds openat2's EAGAIN (a rename elsewhere in the file
// system raced a resolution) and EINTR retries.
const maxRetries = 64

var (
	// forceWalk makes every resolution walk as on a kernel without openat2
	// (tests).
	forceWalk bool
	// noOpenat2 is set once openat2 answered ENOSYS.
	noOpenat2 atomic.Bool
)

// Dir is a directory the host made and holds open; every name a method
// takes is resolved below it. Its methods are safe for concurrent use,
// but for ReadDir, which reads on from where the last call stopped.
type Dir struct {
	fd   int
	f    *os.File // fd, for ReadDir and Close
	name string   // below the Dir Open opened ("." for that one), for errors
	dev  uint64   // the directory's device: the walk's RESOLVE_NO_XDEV
}

// Open opens the directory at path, a host path the host made (trusted up
// to and including its last component, which must not be a link).
func Open(path string) (*Dir, error) {
	fd, err := retry(func() (int, error) {
		return unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return newDir(fd, ".")
}

// newDir makes the Dir of fd, a directory opened O_RDONLY, named name.
// Errors name what they are about by its name below the Dir that Open
// opened, as os.Root's do: never by a host path, which they may reach a
// client with.
func newDir(fd int, name string) (*Dir, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: name, Err: unix.ENOTDIR}
	}
	return &Dir{fd: fd, f: os.NewFile(uintptr(fd), name), name: name, dev: st.Dev}, nil
}

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Sub opens the directory name below d as a Dir of its own.
func (d *Dir) Sub(name string) (*Dir, error) {
	fd, err := d.open(name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, d.err("open", name, err)
	}
	return newDir(fd, d.join(name))
}

// OpenFile opens name below d, as os.OpenFile does, but: O_CREATE always
// comes with O_EXCL (nothing already there, a planted link above all, is
// written through); the open never blocks (O_NONBLOCK, cleared once open:
// a fifo is never waited on); what opens must be a regular file or a
// directory, and a regular file opened for writing that was there already
// must have one link alone (O_TRUNC cuts it once that is known).
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if flag&os.O_CREATE != 0 {
		flag |= os.O_EXCL
	}
	// O_TRUNC waits for the checks: a file is cut once known to be one.
	trunc := flag&os.O_TRUNC != 0
	fd, err := d.open(name, flag&^os.O_TRUNC|unix.O_NONBLOCK, uint32(perm.Perm()))
	if err != nil {
		return nil, d.err("open", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, d.err("stat", name, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG && st.Mode&unix.S_IFMT != unix.S_IFDIR:
		err = ErrNotRegular
	case flag&os.O_CREATE == 0 && flag&(os.O_WRONLY|os.O_RDWR) != 0 && st.Nlink > 1:
		err = ErrLinked
	case trunc && st.Mode&unix.S_IFMT == unix.S_IFREG:
		err = unix.Ftruncate(fd, 0)
	}
	if err == nil {
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return nil, d.err("open", name, err)
	}
	return os.NewFile(uintptr(fd), d.join(name)), nil
}

// Open opens name below d to be read.
func (d *Dir) Open(name string) (*os.File, error) { return d.OpenFile(name, os.O_RDONLY, 0) }

// Create makes the file name below d, which must not exist, to be written.
func (d *Dir) Create(name string, perm fs.FileMode) (*os.File, error) {
	return d.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
}

// ReadFile reads the regular file name below d. Past max bytes it returns
// the first max and an error wrapping ErrTooLarge.
func (d *Dir) ReadFile(name string, max int64) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, d.err("read", name, ErrNotRegular)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, d.err("read", name, err)
	}
	if int64(len(data)) > max {
		return data[:max], d.err("read", name, fmt.Errorf("%w (%d bytes)", ErrTooLarge, max))
	}
	return data, nil
}

// WriteFile makes the file name below d, which must not exist, holding
// data. On error no file is left.
func (d *Dir) WriteFile(name string, data []byte, perm fs.FileMode) error {
	f, err := d.Create(name, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		d.Remove(name)
		return err
	}
	return nil
}

// Mkdir makes the directory name below d.
func (d *Dir) Mkdir(name string, perm fs.FileMode) error {
	return d.at("mkdir", name, func(dir int, base string) error {
		return unix.Mkdirat(dir, base, uint32(perm.Perm()))
	})
}

// MkdirAll makes the directory name below d and every missing parent; a
// link on the way is an error, not followed.
func (d *Dir) MkdirAll(name string, perm fs.FileMode) error {
	clean, err := check(name)
	if err != nil {
		return d.err("mkdir", name, err)
	}
	if clean == "." {
		return nil
	}
	cur := d
	defer func() {
		if cur != d {
			cur.Close()
		}
	}()
	for _, c := range strings.Split(clean, "/") {
		if err := cur.Mkdir(c, perm); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		next, err := cur.Sub(c)
		if err != nil {
			return err
		}
		if cur != d {
			cur.Close()
		}
		cur = next
	}
	return nil
}

// Remove removes the file or empty directory name below d (a link itself,
// never what it names).
func (d *Dir) Remove(name string) error {
	return d.at("remove", name, func(dir int, base string) error {
		err := unix.Unlinkat(dir, base, 0)
		if errors.Is(err, unix.EISDIR) {
			err = unix.Unlinkat(dir, base, unix.AT_REMOVEDIR)
		}
		return err
	})
}

// maxRemoveDepth bounds how deep RemoveAll goes into a tree: it holds one
// open directory a level.
const maxRemoveDepth = 256

// RemoveAll removes name below d and, when it is a directory, everything
// under it, as os.RemoveAll does, but below d: a link is removed, never
// followed, no mount is crossed, and a tree nested deeper than
// maxRemoveDepth is an error. A name that is not there is no error.
func (d *Dir) RemoveAll(name string) error {
	return d.removeAll(name, 0)
}

func (d *Dir) removeAll(name string, depth int) error {
	err := d.Remove(name)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		return err
	}
	if depth >= maxRemoveDepth {
		return d.err("removeall", name, errors.New("nested too deep to remove"))
	}
	sub, err := d.Sub(name)
	if err != nil {
		return err
	}
	defer sub.Close()
	for {
		// In batches: a directory's entries are never all in memory.
		ents, err := sub.ReadDir(256)
		for _, e := range ents {
			if err := sub.removeAll(e.Name(), depth+1); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || err == nil && len(ents) == 0 {
			break
		}
		if err != nil {
			return d.err("removeall", name, err)
		}
	}
	return d.Remove(name)
}

// Rename renames oldname to newname, both below d, replacing what
// newname named (a link itself, never what it names).
func (d *Dir) Rename(oldname, newname string) error {
	return d.at("rename", oldname, func(odir int, obase string) error {
		return d.at("rename", newname, func(ndir int, nbase string) error {
			return unix.Renameat(odir, obase, ndir, nbase)
		})
	})
}

// Lchown changes the owner of name below d (of a link itself, never of
// what it names).
func (d *Dir) Lchown(name string, uid, gid int) error {
	return d.at("lchown", name, func(dir int, base string) error {
		return unix.Fchownat(dir, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Readlink is the target of the symbolic link name below d: read, never
// followed (at most a PATH_MAX's bytes).
func (d *Dir) Readlink(name string) (string, error) {
	var target string
	err := d.at("readlink", name, func(dir int, base string) error {
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dir, base, buf)
		if err != nil {
			return err
		}
		target = string(buf[:n])
		return nil
	})
	return target, err
}

// Lstat describes name below d; a link is described, not followed.
func (d *Dir) Lstat(name string) (fs.FileInfo, error) { return d.stat("lstat", name, true) }

// Stat describes name below d; a link is an error.
func (d *Dir) Stat(name string) (fs.FileInfo, error) { return d.stat("stat", name, false) }

func (d *Dir) stat(op, name string, link bool) (fs.FileInfo, error) {
	// An O_PATH open of the leaf with O_NOFOLLOW is the link itself.
	fd, err := d.open(name, unix.O_PATH, 0)
	if err != nil {
		return nil, d.err(op, name, err)
	}
	f := os.NewFile(uintptr(fd), path.Base(name))
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, d.err(op, name, err)
	}
	if !link && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, d.err(op, name, unix.ELOOP)
	}
	return fi, nil
}

// ReadDir reads on from where the last call stopped the next n entries of
// d (every one left if n <= 0), as os.File.ReadDir does; an entry's Info
// is an Lstat below d.
func (d *Dir) ReadDir(n int) ([]fs.DirEntry, error) {
	ents, err := d.f.ReadDir(n)
	out := make([]fs.DirEntry, len(ents))
	for i, e := range ents {
		out[i] = entry{DirEntry: e, d: d}
	}
	return out, err
}

// entry is a DirEntry whose Info is resolved below its Dir (os's is an
// lstat of a path joined to the directory's name).
type entry struct {
	fs.DirEntry
	d *Dir
}

func (e entry) Info() (fs.FileInfo, error) { return e.d.Lstat(e.Name()) }

// Syncfs writes what d's file system holds through to its device.
func (d *Dir) Syncfs() error {
	if err := unix.Syncfs(d.fd); err != nil {
		return &fs.PathError{Op: "syncfs", Path: d.name, Err: err}
	}
	return nil
}

// at runs fn with the directory holding name (opened O_PATH below d) and
// name's last component.
func (d *Dir) at(op, name string, fn func(dir int, base string) error) error {
	clean, err := check(name)
	if err == nil && clean == "." {
		err = ErrBadName
	}
	if err != nil {
		return d.err(op, name, err)
	}
	pfd, err := d.open(path.Dir(clean), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return d.err(op, name, err)
	}
	defer unix.Close(pfd)
	if err := fn(pfd, path.Base(clean)); err != nil {
		return d.err(op, name, err)
	}
	return nil
}

// open resolves name below d and opens it with flag (O_CLOEXEC and
// O_NOFOLLOW added) and mode; the descriptor is the caller's.
func (d *Dir) open(name string, flag int, mode uint32) (int, error) {
	clean, err := check(name)
	if err != nil {
		return -1, err
	}
	flag |= unix.O_CLOEXEC | unix.O_NOFOLLOW
	if flag&(unix.O_CREAT|unix.O_TMPFILE) == 0 {
		mode = 0 // openat2 refuses a mode it would not use
	}
	if !forceWalk && !noOpenat2.Load() {
		how := unix.OpenHow{Flags: uint64(flag), Mode: uint64(mode), Resolve: resolve}
		fd, err := retry(func() (int, error) { return unix.Openat2(d.fd, clean, &how) })
		if !errors.Is(err, unix.ENOSYS) {
			return fd, err
		}
		noOpenat2.Store(true)
	}
	return d.walk(clean, flag, mode)
}

// walk is open on a kernel without openat2: clean (checked) is resolved a
// component at a time, each opened O_PATH|O_NOFOLLOW and refused unless a
// directory on d's device; the last is opened with flag, and refused if a
// link or on another device.
func (d *Dir) walk(clean string, flag int, mode uint32) (int, error) {
	comps := strings.Split(clean, "/")
	cur := d.fd
	defer func() {
		if cur != d.fd {
			unix.Close(cur)
		}
	}()
	for _, c := range comps[:len(comps)-1] {
		fd, err := retry(func() (int, error) {
			return unix.Openat(cur, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		})
		if err != nil {
			return -1, err
		}
		if cur != d.fd {
			unix.Close(cur)
		}
		cur = fd
		if err := d.checkStep(fd, true, false); err != nil {
			return -1, err
		}
	}
	fd, err := retry(func() (int, error) { return unix.Openat(cur, comps[len(comps)-1], flag, mode) })
	if err != nil {
		return -1, err
	}
	if err := d.checkStep(fd, false, flag&unix.O_PATH != 0 && flag&unix.O_DIRECTORY == 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// checkStep refuses fd, a component walk opened, unless it is on d's
// device and, for a middle component (mid), a directory; a link is
// refused, but as the leaf of an O_PATH open (linkOK: an Lstat's).
func (d *Dir) checkStep(fd int, mid, linkOK bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK && !linkOK:
		return unix.ELOOP
	case st.Dev != d.dev:
		return unix.EXDEV
	case mid && st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return unix.ENOTDIR
	}
	return nil
}

// check cleans name and refuses it if empty, absolute or holding "..".
func check(name string) (string, error) {
	if name == "" || path.IsAbs(name) {
		return "", ErrBadName
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", ErrBadName
		}
	}
	return path.Clean(name), nil
}

// join is name below d as errors and file names show it: below the Dir
// that Open opened.
func (d *Dir) join(name string) string { return path.Join(d.name, name) }

// err wraps e as op's error on name below d.
func (d *Dir) err(op, name string, e error) error {
	var pe *fs.PathError
	if errors.As(e, &pe) {
		return e
	}
	return &fs.PathError{Op: op, Path: d.join(name), Err: e}
}

// retry calls fn again while it fails with EINTR or EAGAIN, a bounded
// number of times.
func retry(fn func() (int, error)) (int, error) {
	for i := 0; ; i++ {
		fd, err := fn()
		if (errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN)) && i < maxRetries {
			continue
		}
		return fd, err
	}
}
