// Package session keeps workspaces that outlive a run.
//
// A session is a directory <store_dir>/sessions/<id> holding disk.img, a
// sparse file of sessions.max_bytes formatted as ext4, lock, created (its
// creation time, which Get reports: the disk's own times move with every
// write) and, once a stateful run has left one, state (state.go). The disk
// image is the kernel-enforced cap: a program that fills it gets ENOSPC and
// the host file never grows past its size. It is mounted (loop device with
// autoclear, nosuid,nodev,noexec) only while a run or a host-side file
// access holds the session's lock, so that nothing stays mounted between
// runs and a crash leaves at most a mount that gc, or the session's next
// access, removes (a run's mount with its container, through OnDeadRuns);
// the loop device goes with its last mount. Hardlinks cannot reach outside the image, since
// it is a file system of its own.
//
// The lock is two OFD locks on the session's lock file: its use (byte 0),
// held by a run or host-side access until it has let go of the disk, and
// its call (byte 1), held until the holder has answered (Lease.Ending). A
// second user gets ErrBusy at once while the call is held, and waits,
// boundedly, for a holder that has answered and is only tearing down. The
// kernel drops both when their holder dies, so a crashed run leaves the
// session usable. The lock file's mtime is the
// session's last use, which gc compares with sessions.ttl.
package session

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/task"
)

// Errors callers tell apart, each of its errkind.
var (
	ErrBusy     = errkind.New(errkind.Busy, "session busy")
	ErrNotFound = errkind.New(errkind.NotFound, "no such session")
	ErrFull     = errkind.New(errkind.Full, "too many sessions")
)

// ValidID reports whether id has the form of a session id: "ss-" and
// 128 random bits in hex.
func ValidID(id string) bool { return task.IsKeptSessionID(id) }

// Store is the sessions of one host.
type Store struct {
	dir      string // <store_dir>/sessions
	mnt      string // <state_dir>/sessions: mount points of host-side accesses
	ttl      time.Duration
	max      int
	maxBytes int64
	uid, gid int
	// reclaim removes what dead runs left (OnDeadRuns); nil: nothing.
	reclaim func() error
}

// Info describes a session.
type Info struct {
	ID       string    `json:"id"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	MaxBytes int64     `json:"max_bytes"`
	// DiskBytes is what the session's image takes on the host disk.
	DiskBytes int64 `json:"disk_bytes"`
	Busy      bool  `json:"busy"`
}

// Open opens (creating its directories) the session store of cfg, whose
// workspaces belong to uid and gid.
func Open(cfg *config.Config, uid, gid int) (*Store, error) {
	ttl, maxBytes := cfg.SessionLimits()
	s := &Store{dir: filepath.Join(cfg.StoreDir, "sessions"), mnt: filepath.Join(cfg.StateDir, "sessions"),
		ttl: ttl, max: cfg.Sessions.Max, maxBytes: maxBytes, uid: uid, gid: gid}
	if filepath.Clean(s.dir) == filepath.Clean(s.mnt) {
		return nil, fmt.Errorf("store_dir and state_dir are both %s: the sessions' mount points would be their directories", filepath.Dir(s.dir))
	}
	for _, d := range []string{s.dir, s.mnt} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating session dir: %w", err)
		}
	}
	return s, nil
}

// OnDeadRuns sets how the store has what dead runs left removed (their
// containers killed, their mounts gone): a run's mount of a session's
// disk is the runner's, under its run dir, and only the runner can kill
// the container that still holds the disk. Mount calls fn when it finds
// the disk of the session it holds still in use: the session's lock is
// free only when its holder has died, so that use is a dead run's.
// Set it before the store is used.
func (s *Store) OnDeadRuns(fn func() error) { s.reclaim = fn }

// MaxBytes is the size of each session's disk.
func (s *Store) MaxBytes() int64 { return s.maxBytes }

func (s *Store) path(id string, name ...string) string {
	return filepath.Join(append([]string{s.dir, id}, name...)...)
}

// lockStore serializes creation and gc of sessions.
func (s *Store) lockStore() (*os.File, error) {
	return state.Lock(filepath.Join(s.dir, ".lock"), unix.LOCK_EX)
}

// Create makes a new session and returns its id. It is refused with
// ErrFull when sessions.max sessions exist.
func (s *Store) Create() (_ string, err error) {
	g, err := s.lockStore()
	if err != nil {
		return "", fmt.Errorf("locking session store: %w", err)
	}
	defer g.Close()
	ids, err := s.ids()
	if err != nil {
		return "", err
	}
	if len(ids) >= s.max {
		return "", fmt.Errorf("%w: %d, the maximum (sessions.max)", ErrFull, len(ids))
	}
	id, err := newID()
	if err != nil {
		return "", err
	}
	// Made under a name gc knows as unfinished, then renamed into place.
	tmp := s.path(".new-" + id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", fmt.Errorf("creating session: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	img := filepath.Join(tmp, "disk.img")
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("creating session disk: %w", err)
	}
	err = f.Truncate(s.maxBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("sizing session disk: %w", err)
	}
	if err := mkfs(img, s.uid, s.gid); err != nil {
		return "", err
	}
	if err := writeCreated(tmp, time.Now()); err != nil {
		return "", err
	}
	lock, err := state.Lock(filepath.Join(tmp, "lock"), unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return "", fmt.Errorf("creating session lock: %w", err)
	}
	defer lock.Close()
	// Mount once to leave an empty, private root: no lost+found.
	mp := filepath.Join(s.mnt, id)
	if err := mountImage(img, mp); err != nil {
		return "", err
	}
	err = os.Remove(filepath.Join(mp, "lost+found"))
	if err == nil {
		err = os.Chmod(mp, 0o700)
	}
	if uerr := unmount(mp); err == nil {
		err = uerr
	}
	if err != nil {
		return "", fmt.Errorf("preparing session disk: %w", err)
	}
	if err := os.Rename(tmp, s.path(id)); err != nil {
		return "", fmt.Errorf("creating session: %w", err)
	}
	return id, nil
}

// newID is a new session id: "ss-" and 128 random bits in hex.
func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("making a session id: %w", err)
	}
	return "ss-" + hex.EncodeToString(b[:]), nil
}

// mkfs formats img as ext4 with its root owned by uid:gid. The inode
// tables are initialised lazily and never zeroed in the background, so
// that the sparse image takes a few MiB on the host until used.
//
// One inode per bytesPerInode of disk: 65536 for the default 256m, 131072
// for 512m. An installed package tree (site-packages, node_modules)
// averages a few KiB a file, so such a disk runs out of space and of
// inodes about together; the inode tables take 1/16 of the disk (256-byte
// inodes). Empty files, fifos and short symlinks take an inode and no
// block: a program that makes only those gets ENOSPC at the inode count.
func mkfs(img string, uid, gid int) error {
	cmd := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-i", strconv.Itoa(bytesPerInode),
		"-E", "lazy_itable_init=1,nodiscard,root_owner="+strconv.Itoa(uid)+":"+strconv.Itoa(gid), img)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// bytesPerInode is mkfs.ext4's inode ratio for session disks.
const bytesPerInode = 4096

// ids lists the sessions, unfinished ones excluded.
func (s *Store) ids() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("reading sessions: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// All describes every session, oldest use first.
func (s *Store) All() ([]Info, error) {
	ids, err := s.ids()
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, id := range ids {
		if in, err := s.Get(id); err == nil {
			out = append(out, *in)
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return a.LastUsed.Compare(b.LastUsed) })
	return out, nil
}

// Get describes session id; ErrNotFound when there is none.
func (s *Store) Get(id string) (*Info, error) {
	if !ValidID(id) {
		return nil, ErrNotFound
	}
	var dst, lst unix.Stat_t
	if err := unix.Lstat(s.path(id, "disk.img"), &dst); err != nil {
		return nil, ErrNotFound
	}
	if err := unix.Lstat(s.path(id, "lock"), &lst); err != nil {
		return nil, ErrNotFound
	}
	in := &Info{ID: id, Created: s.created(id, &dst), LastUsed: time.Unix(lst.Mtim.Unix()),
		MaxBytes: dst.Size, DiskBytes: dst.Blocks * 512}
	in.Busy = s.busy(id)
	return in, nil
}

// createdName is the file of a session's directory that holds its
// creation time, in RFC 3339 with nanoseconds: written once, at its
// creation or fork, by agentrun alone (no sandbox reaches the session's
// directory).
const createdName = "created"

// maxCreated bounds what Get reads of it.
const maxCreated = 64

// writeCreated records t as the creation time of the session being made
// in directory dir.
func writeCreated(dir string, t time.Time) error {
	f, err := os.OpenFile(filepath.Join(dir, createdName), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("recording the session's creation time: %w", err)
	}
	_, err = f.WriteString(t.UTC().Format(time.RFC3339Nano))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("recording the session's creation time: %w", err)
	}
	return nil
}

// created is session id's creation time: what writeCreated recorded, or,
// for a session made before agentrun recorded it, the change time of its
// disk (disk, its stat), which moves with every write.
func (s *Store) created(id string, disk *unix.Stat_t) time.Time {
	f, err := os.OpenFile(s.path(id, createdName), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == nil {
		defer f.Close()
		b := make([]byte, maxCreated)
		n, _ := io.ReadFull(f, b)
		if t, err := time.Parse(time.RFC3339Nano, string(b[:n])); err == nil {
			return t
		}
	}
	return time.Unix(disk.Ctim.Unix())
}

// busy reports whether session id is held by a user that has not
// answered yet (a Lock would be refused), without taking its lock (so
// that asking never makes a run's lock fail).
func (s *Store) busy(id string) bool {
	f, err := os.OpenFile(s.path(id, "lock"), os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	// The call's byte: a holder that has answered is ending, and the next
	// Lock waits for it instead of being refused.
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: callByte, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false
	}
	return lk.Type != unix.F_UNLCK
}

// Lease is the exclusive use of a session, until Release.
type Lease struct {
	s    *Store
	ID   string
	lock *os.File
}

// The byte ranges of a session's lock file that its two locks take.
const (
	useByte  = 0
	callByte = 1
)

// endingWait bounds how long Lock waits for a holder that has answered
// (Lease.Ending) to let go of the session: its run's tear-down (the
// container killed, the disk unmounted), tens of milliseconds.
const endingWait = 10 * time.Second

// Lock takes session id for one user: ErrNotFound if it does not exist,
// ErrBusy at once if another holds it and has not answered yet. A holder
// that has answered (Lease.Ending) is waited for, at most endingWait, so
// that a client's next call of a session never finds it busy with the
// tear-down of the call it was answered.
func (s *Store) Lock(id string) (*Lease, error) { return s.lock(id, endingWait) }

// lock is Lock, waiting at most wait for an ending holder.
func (s *Store) lock(id string, wait time.Duration) (*Lease, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if _, err := os.Lstat(s.path(id, "disk.img")); err != nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	f, err := os.OpenFile(s.path(id, "lock"), os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	// Open file description locks (released when their holder dies, like
	// flock) that busy can test without taking. The call first: a second
	// newcomer is refused at once while the first waits for the use.
	if err := setLock(f, callByte, unix.F_WRLCK); err != nil {
		f.Close()
		if errors.Is(err, ErrBusy) {
			return nil, fmt.Errorf("%w: %s has a run or file access in progress", ErrBusy, id)
		}
		return nil, err
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(2 * time.Millisecond) {
		err := setLock(f, useByte, unix.F_WRLCK)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, ErrBusy) {
				return nil, fmt.Errorf("%w: %s: its last run has answered but is still ending after %s", ErrBusy, id, wait)
			}
			return nil, err
		}
	}
	// gc may have removed it between the check and the lock.
	if _, err := os.Lstat(s.path(id, "disk.img")); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return &Lease{s: s, ID: id, lock: f}, nil
}

// setLock sets (F_WRLCK) or clears (F_UNLCK) the OFD lock of f's byte at,
// without waiting: ErrBusy where another holds it.
func setLock(f *os.File, at int64, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: at, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
			return ErrBusy
		}
		return fmt.Errorf("locking session: %w", err)
	}
	return nil
}

// Ending says that the lease's holder has answered and is only tearing
// down: a new Lock of the session waits for its Release instead of being
// refused.
func (l *Lease) Ending() {
	if l == nil || l.lock == nil {
		return
	}
	setLock(l.lock, callByte, unix.F_UNLCK) // clearing a lock one holds cannot be refused
}

// Mount mounts the session's disk at dir (created 0700). What a process
// killed while it held the session left at dir (the mount point, the disk
// still mounted on it) is removed first. A loop device that still holds
// the disk belongs to a holder that is gone, since the lease's lock is
// free only once its holder has ended or died: a run that ended lets go of
// it a moment after its mount is detached, and a run that died (its
// agentrun killed) holds it until its container is killed, which Mount
// has done (OnDeadRuns) if the disk is still held after a short wait.
// Mount is refused (ErrBusy) while the disk is still held after that:
// mounting the file system twice would corrupt it.
func (l *Lease) Mount(dir string) error {
	if err := clearMountPoint(dir); err != nil {
		return err
	}
	if err := l.settle(); err != nil {
		return err
	}
	return mountImage(l.s.path(l.ID, "disk.img"), dir)
}

// settle waits for no loop device to hold the session's disk, having what
// dead runs left removed (OnDeadRuns) when one still does after a short
// wait: ErrBusy while one still does after that. The disk is then the
// lease's alone, to mount or to copy.
func (l *Lease) settle() error {
	img := l.s.path(l.ID, "disk.img")
	if !detached(img, detachWait) {
		if l.s.reclaim == nil {
			return fmt.Errorf("%w: %s: its disk is still mounted by a run that is ending or died (agentrun gc removes what a dead run left)", ErrBusy, l.ID)
		}
		if err := l.s.reclaim(); err != nil {
			return fmt.Errorf("%w: %s: its disk is still mounted by a run that died, and removing what it left failed: %w", ErrBusy, l.ID, err)
		}
		if !detached(img, reclaimWait) {
			return fmt.Errorf("%w: %s: its disk is still mounted by a run that is ending, or by one of another state_dir that died (agentrun gc with that config removes what it left)", ErrBusy, l.ID)
		}
	}
	return nil
}

// detached waits at most wait for no loop device to hold img, and reports
// whether none does.
func detached(img string, wait time.Duration) bool {
	for deadline := time.Now().Add(wait); attached(img); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// detachWait bounds how long Mount waits for the loop device of a mount
// that was just removed; reclaimWait, for the loop device of a dead run
// once its container is killed (its mount namespace goes with its last
// process).
const (
	detachWait  = time.Second
	reclaimWait = 5 * time.Second
)

// Release marks the session used now and lets others take it.
func (l *Lease) Release() {
	if l == nil || l.lock == nil {
		return
	}
	now := time.Now()
	os.Chtimes(l.s.path(l.ID, "lock"), now, now)
	l.lock.Close()
	l.lock = nil
}

// Remove deletes session id; ErrBusy while it is in use.
func (s *Store) Remove(id string) error {
	l, err := s.Lock(id)
	if err != nil {
		return err
	}
	defer l.lock.Close()
	return s.remove(id)
}

// remove deletes the session's directory; its lock is held or free.
func (s *Store) remove(id string) error {
	// Renamed away first so that no one locks it between the removals.
	gone := s.path(".rm-" + id)
	if err := os.Rename(s.path(id), gone); err != nil {
		return fmt.Errorf("removing session: %w", err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("removing session: %w", err)
	}
	return nil
}

// GC removes sessions idle for longer than the TTL, what crashed creations
// and removals left, and the mount points (and mounts) of host-side
// accesses that died. A
// session in use is never touched. It returns the ids it removed.
func (s *Store) GC(now time.Time) ([]string, error) {
	g, err := s.lockStore()
	if err != nil {
		return nil, fmt.Errorf("locking session store: %w", err)
	}
	defer g.Close()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("reading sessions: %w", err)
	}
	var removed []string
	var errs []error
	// The mount points of sessions that are gone (removed, or whose
	// creation died: creations hold the store lock) are stale, since
	// nothing can take their lock any more.
	live := map[string]bool{}
	for _, e := range ents {
		live[e.Name()] = ValidID(e.Name())
	}
	left, err := os.ReadDir(s.mnt)
	if err != nil {
		return nil, fmt.Errorf("reading session mount points: %w", err)
	}
	for _, e := range left {
		if ValidID(e.Name()) && !live[e.Name()] {
			errs = append(errs, clearMountPoint(filepath.Join(s.mnt, e.Name())))
		}
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, ".rm-"):
			errs = append(errs, os.RemoveAll(s.path(name)))
		case strings.HasPrefix(name, ".new-"):
			// Creations hold the store lock, so this one died (its
			// mount point went above).
			errs = append(errs, os.RemoveAll(s.path(name)))
		case ValidID(name):
			l, err := s.lock(name, 0)
			if err != nil {
				continue // busy, or gone
			}
			// Free: the mount point of a host-side access that died, and
			// its mount if it got that far, are stale.
			if err := clearMountPoint(filepath.Join(s.mnt, name)); err != nil {
				errs = append(errs, fmt.Errorf("session %s: %w", name, err))
			}
			st, err := os.Stat(s.path(name, "lock"))
			if err == nil && now.Sub(st.ModTime()) > s.ttl {
				if err := s.remove(name); err != nil {
					errs = append(errs, fmt.Errorf("session %s: %w", name, err))
				} else {
					removed = append(removed, name)
				}
			}
			l.lock.Close()
		}
	}
	return removed, errors.Join(errs...)
}

// UnmountUnder detaches every mount at or below dir, deepest first.
func UnmountUnder(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("reading mounts: %w", err)
	}
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
