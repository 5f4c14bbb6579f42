package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/safefs"
)

// Workspace is one run's workspace tmpfs.
type Workspace struct {
	// Dir is the mount point on the host.
	Dir  string
	root *safefs.Dir
	// replace: files written replace those of the same name (a kept
	// session's workspace holds the last run's files).
	replace bool
	// shared: Share made its mount shared.
	shared bool
	// capacity says what bounds the workspace's size, for the refusal of
	// a file that does not fit.
	capacity string
}

// ErrNoRoom is wrapped by the refusal of a file that does not fit in the
// workspace (errkind.TooLarge): it names the file, as the task named it,
// and the bound, never a host path.
var ErrNoRoom = errkind.New(errkind.TooLarge, "no room in the workspace")

// Create mounts a tmpfs of size bytes at dir (created, 0700), owned by uid
// and gid, and writes files into it (names are workspace-relative and
// already validated; parents are created). On error nothing is left mounted.
func Create(dir string, size int64, uid, gid int, files map[string][]byte) (_ *Workspace, err error) {
	if err := mountTmpfs(dir, size, "mode=0700,uid="+strconv.Itoa(uid)+",gid="+strconv.Itoa(gid)); err != nil {
		return nil, fmt.Errorf("workspace: %w", err)
	}
	capacity := fmt.Sprintf("the workspace size (limits.workspace_size) is %d bytes", size)
	return open(&Workspace{Dir: dir, capacity: capacity}, uid, gid, files)
}

// CreateTmp mounts a tmpfs of size bytes at dir (created, 0700), whose
// root is root's and 1777 as a /tmp's is: a live sandbox's /tmp
// (spec.WithTmpDir), which the host reaches with the same link-safe
// methods as a workspace. On error nothing is left mounted.
func CreateTmp(dir string, size int64) (*Workspace, error) {
	if err := mountTmpfs(dir, size, "mode=1777,uid=0,gid=0"); err != nil {
		return nil, fmt.Errorf("/tmp: %w", err)
	}
	capacity := fmt.Sprintf("/tmp's size (limits.tmp_size) is %d bytes", size)
	return open(&Workspace{Dir: dir, capacity: capacity}, 0, 0, nil)
}

// mountTmpfs mounts a tmpfs of size bytes with the options opts at dir,
// which it creates (0700); on error it leaves neither.
func mountTmpfs(dir string, size int64, opts string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating its dir: %w", bare(err))
	}
	opts = "size=" + strconv.FormatInt(size, 10) + "," + opts
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		os.Remove(dir)
		return fmt.Errorf("mounting its tmpfs: %w", err)
	}
	return nil
}

// maxStacked bounds the mounts Close removes from a shared workspace's
// directory: its own and one mounted on it.
const maxStacked = 2

// Share makes the workspace's mount shared (its own peer group), so that
// a mount made on its directory later propagates to its slaves: the
// /workspace of a sandbox prepared ahead, which mounts it as a slave
// (spec.WithWorkspaceSlave) and so gets a kept session's disk when a run
// takes it; nothing mounted in the sandbox reaches the host. Close then
// unmounts what was mounted on it too.
func (w *Workspace) Share() error {
	if err := unix.Mount("", w.Dir, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making the workspace's mount shared: %w", err)
	}
	w.shared = true
	return nil
}

// Adopt makes the file system already mounted at dir (a kept session's
// disk, of size bytes) the workspace and writes files into it, replacing
// files of the same name. Close unmounts it. On error nothing is left
// mounted.
func Adopt(dir string, size int64, uid, gid int, files map[string][]byte) (*Workspace, error) {
	capacity := fmt.Sprintf("the session's disk (sessions.max_bytes) is %d bytes, with what it already holds", size)
	return open(&Workspace{Dir: dir, replace: true, capacity: capacity}, uid, gid, files)
}

// open opens the root of w, mounted at w.Dir, and writes files into it; on
// error it unmounts w.
func open(w *Workspace, uid, gid int, files map[string][]byte) (_ *Workspace, err error) {
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.root, err = safefs.Open(w.Dir); err != nil {
		return nil, fmt.Errorf("opening workspace: %w", err)
	}
	if err := w.Write(files, uid, gid); err != nil {
		return nil, err
	}
	return w, nil
}

// Write writes files into the workspace, owned by uid and gid (names are
// workspace-relative and already validated; parents are created). A file
// that exists already is an error.
func (w *Workspace) Write(files map[string][]byte, uid, gid int) error {
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := w.write(name, files[name], uid, gid); err != nil {
			return fmt.Errorf("writing workspace file %q: %w", name, err)
		}
	}
	return nil
}

func (w *Workspace) write(name string, data []byte, uid, gid int) error {
	return w.writeFrom(name, bytes.NewReader(data), int64(len(data)), uid, gid)
}

// WriteFrom writes the file name (workspace-relative, already validated;
// parents are created) from the size bytes of r, owned by uid and gid,
// replacing what is there (a symlink is replaced, never written through;
// a directory is an error).
func (w *Workspace) WriteFrom(name string, r io.Reader, size int64, uid, gid int) error {
	rw := *w
	rw.replace = true
	if err := rw.writeFrom(name, r, size, uid, gid); err != nil {
		return fmt.Errorf("writing workspace file %q: %w", name, err)
	}
	return nil
}

// writeFrom writes name from the size bytes of r. Its errors name the
// file as the task named it, never its host path; one that does not fit
// (ENOSPC, EDQUOT) is ErrNoRoom.
func (w *Workspace) writeFrom(name string, r io.Reader, size int64, uid, gid int) (err error) {
	defer func() {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			err = fmt.Errorf("%w for its %d bytes: %s", ErrNoRoom, size, w.capacity)
		}
	}()
	if dir := path.Dir(name); dir != "." {
		if err := w.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// Parents created here belong to the program too.
		for d := dir; d != "."; d = path.Dir(d) {
			if err := w.root.Lchown(d, uid, gid); err != nil {
				return err
			}
		}
	}
	if w.replace {
		// Whatever is there (a symlink, a fifo) goes; a directory stays
		// and is an error.
		if err := w.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	f, err := w.root.Create(name, 0o644)
	if err != nil {
		return err
	}
	// The file's own errors name its host path: they are said without it.
	n, err := io.Copy(f, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("%d bytes of %d: %w", n, size, io.ErrUnexpectedEOF)
	}
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		w.root.Remove(name)
		return bare(err)
	}
	return nil
}

// OpenRegular opens the workspace's regular file name to read: never
// through a symlink at its end, never blocking on a fifo; anything but a
// regular file is refused.
func (w *Workspace) OpenRegular(name string) (*os.File, error) {
	f, err := w.root.OpenFile(name, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, bare(err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%q is not a regular file", name)
	}
	return f, nil
}

// Root is the workspace's root, held open until Close: every name below
// it is resolved link-safe. Its ReadDir is not to be used (it reads on
// from the last call's end): a list opens a Sub of its own.
func (w *Workspace) Root() *safefs.Dir { return w.root }

// RemoveAll removes the workspace's name and, if it is a directory,
// everything under it, never following a link.
func (w *Workspace) RemoveAll(name string) error {
	return w.root.RemoveAll(name)
}

// bare is err without the host path that an *fs.PathError names.
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// Sync writes what the workspace's file system holds through to its
// device (syncfs): for a kept session's disk, the loop device's flush is
// an fsync of its image on the host's disk.
func (w *Workspace) Sync() error {
	if w.root == nil {
		return errors.New("syncing workspace: it is closed")
	}
	if err := w.root.Syncfs(); err != nil {
		return fmt.Errorf("syncing workspace: %w", err)
	}
	return nil
}

// Close unmounts the workspace and removes its mount point.
func (w *Workspace) Close() error {
	if w.root != nil {
		w.root.Close()
		w.root = nil
	}
	var errs []error
	// What was mounted on it later (a kept session's disk, on a shared
	// one) goes too.
	for range maxStacked {
		err := unix.Unmount(w.Dir, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("unmounting workspace: %w", err))
			break
		}
		if !w.shared {
			break
		}
	}
	if err := os.Remove(w.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing workspace dir: %w", bare(err)))
	}
	return errors.Join(errs...)
}

// reason is err without the path a PathError repeats.
func reason(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
