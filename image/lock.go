package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/state"
)

// fileLock is a flock(2) lock. Locks are per open file, so two Stores in
// one process exclude each other just as two processes do.
type fileLock struct{ f *os.File }

const lockPoll = 10 * time.Millisecond

// lockPath takes an exclusive (or, with shared, a shared) lock on path,
// creating it, and waits for it until ctx ends.
func lockPath(ctx context.Context, path string, shared bool) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock: %w", err)
	}
	l, err := lockFile(ctx, f, shared)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return l, nil
}

// lockFile locks an open file or directory, polling so that ctx can
// cancel the wait.
func lockFile(ctx context.Context, f *os.File, shared bool) (*fileLock, error) {
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	for {
		err := state.Flock(f, how|unix.LOCK_NB)
		if err == nil {
			return &fileLock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return nil, err
		}
		t := time.NewTimer(lockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// tryLock locks f without waiting; ok is false if someone holds it.
func tryLock(f *os.File) (ok bool, err error) {
	err = state.Flock(f, unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}

func (l *fileLock) unlock() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the last descriptor drops the lock
		l.f = nil
	}
}
