// Package uidpool hands each sandbox a host uid and gid of its own, from a
// configured range, so that the kernel's per-user limits (inotify
// instances and watches, POSIX message queue bytes, pending signals,
// pipe buffer pages, processes) are each run's own instead of shared by
// every run on the host.
//
// A reservation is a symlink <dir>/<uid> whose target is the owner's name:
// the absolute path of a run's dir, which says both the run and the state
// dir of the agentrun that made it. Making it is atomic (symlink fails when
// the name exists), so concurrent agentrun processes never get the same
// id. The reservations live in one directory for the whole host (DefaultDir,
// config key run_uids.dir), whatever each agentrun's state dir: serve and
// a worker, or two services with state dirs of their own, never give one
// id to two sandboxes at once, even when their ranges overlap. A
// reservation outlives its process on purpose: after a crash the dead
// run's processes may still run as that uid until gc has killed them, so
// a reservation is only given back by its owner (Free, once its sandbox
// is torn down) or by the gc of the owner's state dir (Reclaim, once the
// owner is known dead and cleaned), never by another agentrun's.
package uidpool

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agentrun/agentrun/internal/uidrange"
)

// The range's defaults and bound, the rule run_uids is checked by
// (uidrange's).
const (
	DefaultFirst = uidrange.DefaultFirst
	DefaultCount = uidrange.DefaultCount
	DefaultDir   = uidrange.DefaultDir
	MaxID        = uidrange.MaxID
)

// ErrExhausted is returned when every id of the range is reserved.
var ErrExhausted = errors.New("every id of the range is in use")

// Range is a range of ids and the directory of their reservations.
type Range struct {
	dir          string
	first, count uint32
}

// Open returns the range of ids first .. first+count-1, whose reservations
// live in dir (created 0700; its missing parents 0755, as /run/agentrun,
// which holds serve's socket, is).
func Open(dir string, first, count int64) (*Range, error) {
	if err := uidrange.Check(first, count); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("creating uid reservations dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating uid reservations dir: %w", err)
	}
	return &Range{dir: dir, first: uint32(first), count: uint32(count)}, nil
}

// Take reserves a free id for owner (a run's dir: an absolute, clean
// path) and returns it; the id serves as both uid and gid. The search
// starts at a random place in the range, so that ids are seldom reused at
// once and concurrent takers seldom meet.
func (p *Range) Take(owner string) (uint32, error) {
	if !filepath.IsAbs(owner) || filepath.Clean(owner) != owner {
		return 0, fmt.Errorf("uid owner %q is not a clean absolute path", owner)
	}
	var b [4]byte
	rand.Read(b[:])
	start := uint64(binary.LittleEndian.Uint32(b[:]) % p.count)
	for i := uint64(0); i < uint64(p.count); i++ {
		id := p.first + uint32((start+i)%uint64(p.count))
		err := os.Symlink(owner, p.path(id))
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return 0, fmt.Errorf("reserving uid %d: %w", id, err)
		}
	}
	return 0, fmt.Errorf("reserving a uid: %w (%d ids from %d)", ErrExhausted, p.count, p.first)
}

// Free gives id back if owner still holds it.
func (p *Range) Free(id uint32, owner string) error {
	if got, err := os.Readlink(p.path(id)); err != nil || got != owner {
		return nil // gone already, or not owner's
	}
	if err := os.Remove(p.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("freeing uid %d: %w", id, err)
	}
	return nil
}

// Held lists the reserved ids and their owners.
func (p *Range) Held() (map[uint32]string, error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, fmt.Errorf("reading uid reservations: %w", err)
	}
	held := map[uint32]string{}
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		if owner, err := os.Readlink(filepath.Join(p.dir, e.Name())); err == nil {
			held[uint32(id)] = owner
		}
	}
	return held, nil
}

// Reclaim frees every reservation whose owner dead reports as gone for
// good, and returns the ids freed. The caller makes sure that no owner
// it calls dead can still take or use an id (gc: the owner's run is
// cleaned and its processes are gone).
func (p *Range) Reclaim(dead func(owner string) bool) ([]uint32, error) {
	held, err := p.Held()
	if err != nil {
		return nil, err
	}
	var freed []uint32
	var errs []error
	for id, owner := range held {
		if !dead(owner) {
			continue
		}
		if err := p.Free(id, owner); err != nil {
			errs = append(errs, err)
			continue
		}
		freed = append(freed, id)
	}
	return freed, errors.Join(errs...)
}

func (p *Range) path(id uint32) string {
	return filepath.Join(p.dir, strconv.FormatUint(uint64(id), 10))
}

// HostNames lists the users and groups of the passwd and group files
// (/etc/passwd, /etc/group) that hold an id of the range: such a user
// would share the per-user limits of a sandbox with that id, and could
// signal or trace its processes. A file that cannot be read is an error.
func HostNames(first, count int64, files ...string) ([]string, error) {
	var names []string
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) < 3 {
				continue
			}
			id, err := strconv.ParseInt(f[2], 10, 64)
			if err == nil && id >= first && id-first < count {
				names = append(names, fmt.Sprintf("%s %s (%d)", filepath.Base(file), f[0], id))
			}
		}
	}
	return names, nil
}
