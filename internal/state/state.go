package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
// creating (waits), exclusive while removing. The exclusive lock is tried
// for up to removeWait and then given up: a run being created holds it,
// and that run removes the parent when it ends. The returned function
// releases it.
func LockCgroupParent(backendDir string, exclusive bool) (func(), error) {
	path := filepath.Join(backendDir, cgroupLock)
	var f *os.File
	var err error
	if !exclusive {
		f, err = Lock(path, unix.LOCK_SH)
	} else {
		// Another run's removal holds it only briefly; waiting for it
		// matters: two runs ending together would otherwise both give up
		// and leave the parent behind.
		for delay, deadline := time.Millisecond, time.Now().Add(removeWait); ; delay *= 2 {
			if f, err = Lock(path, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
				break
			}
			time.Sleep(delay)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("locking cgroup parent: %w", err)
	}
	return func() { f.Close() }, nil
}

// removeWait bounds how long removing the shared parent cgroup waits for
// its lock.
const removeWait = 250 * time.Millisecond
