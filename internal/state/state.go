package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Flock flocks the open file f with how: unix.LOCK_SH or LOCK_EX, with
// LOCK_NB not to wait (then a lock held elsewhere is unix.EWOULDBLOCK), or
// LOCK_UN. It is agentrun's one flock(2) call.
func Flock(f *os.File, how int) error { return unix.Flock(int(f.Fd()), how) }

// Lock opens (creating) path and flocks it with how (Flock). Closing the
// file releases the lock.
func Lock(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := Flock(f, how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

const (
	gcLock     = "gc.lock"
	runsDir    = "runs"
	runLock    = "lock"
	cgroupLock = "cgroup.lock"
)

// RunsDir is where the runs of stateDir have their run dirs.
func RunsDir(stateDir string) string { return filepath.Join(stateDir, runsDir) }

// Register creates run id's dir under stateDir and locks it for the life of
// the run; closing lock ends the run's claim, after its dir is removed.
func Register(stateDir, id string) (dir string, lock *os.File, err error) {
	g, err := Lock(filepath.Join(stateDir, gcLock), unix.LOCK_SH)
	if err != nil {
		return "", nil, fmt.Errorf("locking state dir: %w", err)
	}
	defer g.Close()
	dir = filepath.Join(RunsDir(stateDir), id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, fmt.Errorf("creating run dir: %w", err)
	}
	if lock, err = Lock(filepath.Join(dir, runLock), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("locking run dir: %w", err)
	}
	return dir, lock, nil
}

// LockGC takes stateDir's gc lock exclusively: no run registers until the
// returned file is closed.
func LockGC(stateDir string) (*os.File, error) {
	g, err := Lock(filepath.Join(stateDir, gcLock), unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("locking state dir: %w", err)
	}
	return g, nil
}

// Claim takes the lock of run id, under the gc lock: live is true (and
// lock nil) when the run's agentrun holds it still. lock is nil too when
// the run has no run dir left.
func Claim(stateDir, id string) (lock *os.File, live bool) {
	lock, err := Lock(filepath.Join(RunsDir(stateDir), id, runLock), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil, true
	}
	return lock, false
}

// IDs lists the names of the directories in dir that valid accepts: the
// runs a backend keeps state for. A missing dir holds none.
func IDs(dir string, valid func(string) bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && valid(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// LockCgroupParent takes a backend's cgroup-parent lock, in its state dir
// backendDir, that makes creating a run's cgroup and removing the empty
// shared parent cgroup mutually exclusive, across processes: shared while
// creating (waits), exclusive while removing.
//
// A removal waits for other removals only (each holds the lock for a few
// rmdirs). It never waits for a run being created, which may hold the
// shared lock for a whole container start and, under load, one start
// overlaps the next: it fails at once instead (EWOULDBLOCK), and the
// parent, in use, stays. The returned function releases it.
func LockCgroupParent(backendDir string, exclusive bool) (func(), error) {
	path := filepath.Join(backendDir, cgroupLock)
	if !exclusive {
		f, err := Lock(path, unix.LOCK_SH)
		if err != nil {
			return nil, fmt.Errorf("locking cgroup parent: %w", err)
		}
		return func() { f.Close() }, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup lock: %w", err)
	}
	// Removals queue on an open-file-description lock of the same file
	// (independent of flock), then take the flock if no run is being
	// created.
	err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 1})
	if err == nil {
		err = Flock(f, unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking cgroup parent: %w", err)
	}
	return func() { f.Close() }, nil
}

// RemoveCgroupParent calls remove, which removes a backend's shared
// parent cgroup where it is empty, holding the backend's cgroup-parent
// lock (in backendDir) exclusively. While a run's cgroup is being made in
// it, or when backendDir is not there (no run of it was ever made), it
// does nothing.
func RemoveCgroupParent(backendDir string, remove func() error) error {
	unlock, err := LockCgroupParent(backendDir, true)
	if errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	return remove()
}
