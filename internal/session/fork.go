package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/errkind"
)

// MaxFork is the most sessions one fork makes.
const MaxFork = 64

// Errors of a fork: its count out of bounds (errkind.Invalid), and no room
// on the store's file system for its copies (errkind.Full).
var (
	ErrBadCount = errkind.New(errkind.Invalid, "bad count")
	ErrNoRoom   = errkind.New(errkind.Full, "session store full")
)

// Forked is what a fork made: the new sessions' ids, how their files were
// copied, and the bytes it copied (0 where every block is shared).
type Forked struct {
	IDs    []string `json:"ids"`
	Mode   CopyMode `json:"copy"`
	Copied int64    `json:"copied_bytes"`
}

// forkHook, when set (by tests), runs after the i-th copy is made; an
// error fails the fork there.
var forkHook func(i int) error

// Fork makes n new sessions (1 to MaxFork), each holding a copy of every
// regular file of session id's directory (its disk, and its kept state)
// but its lock and creation time, which each copy gets fresh:
// independent from then on. The source is held (ErrBusy while a run or file access has it)
// and its disk detached while it is copied. It is all or nothing: a fork
// past sessions.max is refused whole (ErrFull), so is one whose copies the
// store has no room for (ErrNoRoom), and a failure removes the copies made so far.
// Where the store's file system shares blocks (FICLONE: btrfs, XFS) the
// copies share the source's; elsewhere only the files' data extents are
// copied, so a sparse disk costs what it holds, not its size. Creations
// and gc wait for a fork (it holds the store's lock); ctx ends it, rolled
// back, between two extents.
func (s *Store) Fork(ctx context.Context, id string, n int) (_ *Forked, err error) {
	if n < 1 || n > MaxFork {
		return nil, fmt.Errorf("%w: count %d: must be between 1 and %d", ErrBadCount, n, MaxFork)
	}
	g, err := s.lockStore()
	if err != nil {
		return nil, fmt.Errorf("locking session store: %w", err)
	}
	defer g.Close()
	l, err := s.Lock(id)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	if err := clearMountPoint(filepath.Join(s.mnt, id)); err != nil {
		return nil, err
	}
	if err := l.settle(); err != nil {
		return nil, err
	}
	ids, err := s.ids()
	if err != nil {
		return nil, err
	}
	if len(ids)+n > s.max {
		return nil, fmt.Errorf("%w: %d sessions and %d copies would pass sessions.max, %d", ErrFull, len(ids), n, s.max)
	}
	files, held, err := sourceFiles(s.path(id))
	if err != nil {
		return nil, err
	}
	out := &Forked{Mode: s.CopyMode()}
	if out.Mode == Copy {
		if err := s.checkRoom(int64(n) * held); err != nil {
			return nil, err
		}
	}
	var undo cleanup.Cleanup
	defer func() {
		if err != nil {
			if cerr := undo.Clean(); cerr != nil {
				err = fmt.Errorf("%w (and removing the copies made: %w)", err, cerr)
			}
		}
	}()
	tmps := make([]string, n)
	for i := range n {
		nid, err := newID()
		if err != nil {
			return nil, err
		}
		tmps[i] = s.path(".new-" + nid)
		if err := os.Mkdir(tmps[i], 0o700); err != nil {
			return nil, fmt.Errorf("creating session: %w", err)
		}
		undo.Add(removeAll(tmps[i]))
		copied, err := copyFiles(ctx, s.path(id), tmps[i], files, out.Mode)
		out.Copied += copied
		if err != nil {
			return nil, fmt.Errorf("copying session %s: %w", id, err)
		}
		if err := newLock(filepath.Join(tmps[i], "lock")); err != nil {
			return nil, err
		}
		if err := writeCreated(tmps[i], time.Now()); err != nil {
			return nil, err
		}
		if forkHook != nil {
			if err := forkHook(i); err != nil {
				return nil, err
			}
		}
		out.IDs = append(out.IDs, nid)
	}
	for i, nid := range out.IDs {
		if err := os.Rename(tmps[i], s.path(nid)); err != nil {
			return nil, fmt.Errorf("creating session: %w", err)
		}
		undo.Add(removeAll(s.path(nid)))
	}
	return out, nil
}

// removeAll is the undo step that removes dir.
func removeAll(dir string) func() error {
	return func() error { return os.RemoveAll(dir) }
}

// newLock makes a session's lock file, whose mtime is its last use.
func newLock(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("creating session lock: %w", err)
	}
	return f.Close()
}

// sourceFiles lists the regular files of the session directory dir but its
// lock and its creation time (each copy gets its own) and a state not
// committed, and the bytes they hold on the host. Anything else there (none is
// made by agentrun) is never followed or copied.
func sourceFiles(dir string) (names []string, held int64, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("reading session: %w", err)
	}
	for _, e := range ents {
		if e.Name() == "lock" || e.Name() == createdName || e.Name() == stateNewName || !e.Type().IsRegular() {
			continue
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err != nil {
			return nil, 0, fmt.Errorf("reading session: %w", err)
		}
		names = append(names, e.Name())
		held += st.Blocks * 512
	}
	return names, held, nil
}

// checkRoom refuses (ErrNoRoom) copies of need bytes that the store's file
// system has no room for, before a byte is copied.
func (s *Store) checkRoom(need int64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(s.dir, &fs); err != nil {
		return fmt.Errorf("reading the session store's free space: %w", err)
	}
	if free := int64(fs.Bavail) * fs.Bsize; need > free {
		return fmt.Errorf("%w: the copies need %d bytes and its file system has %d free", ErrNoRoom, need, free)
	}
	return nil
}
