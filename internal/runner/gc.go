package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/toolbroker"
)

// register creates the run dir of id and locks it for the life of the run
// (the protocol is package state's).
func (r *Runner) register(id string) (dir string, lock *os.File, err error) {
	return state.Register(r.cfg.StateDir, id)
}

// GC removes what runs of agentrun processes that died left behind:
// their containers and processes, cgroups, mounts and state. Runs of live
// agentrun processes are not touched. It returns the ids it cleaned.
// Sessions idle past their TTL are removed too, and their ids listed.
func (r *Runner) GC() ([]string, error) {
	cleaned, err := r.gcRuns()
	// After the runs: a dead run's mount of a session is gone now.
	gone, serr := r.sessions.GC(time.Now())
	return append(cleaned, gone...), errors.Join(err, serr)
}

// RemoveCgroupParents removes each runtime's shared parent cgroup, which
// its runs keep once made (backend.Leftovers.RemoveCgroupParent), where it
// is empty and no run's cgroup is being made in it; `agentrun gc` ends
// with it. A parent in use stays.
func (r *Runner) RemoveCgroupParents() error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(r.leftovers)) {
		if err := r.leftovers[name].RemoveCgroupParent(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// reclaimRuns is gcRuns for the session store (session.Store.OnDeadRuns):
// a session's disk still held once its lock is free is a dead run's.
func (r *Runner) reclaimRuns() error {
	_, err := r.gcRuns()
	return err
}

// gcRuns removes what dead runs left, and the uid reservations of the
// runs it removed, and returns their ids.
func (r *Runner) gcRuns() ([]string, error) {
	g, err := state.LockGC(r.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	defer g.Close()

	ids := map[string]bool{}
	runs, err := os.ReadDir(r.runsDir)
	if err != nil {
		return nil, fmt.Errorf("reading run dirs: %w", err)
	}
	for _, e := range runs {
		ids[e.Name()] = true
	}
	for name, be := range r.leftovers {
		bids, err := be.IDs()
		if err != nil {
			return nil, fmt.Errorf("reading %s state: %w", name, err)
		}
		for _, id := range bids {
			ids[id] = true
		}
	}

	var cleaned []string
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		if !strings.HasPrefix(id, "ar-") {
			continue
		}
		dir := filepath.Join(r.runsDir, id)
		lock, live := state.Claim(r.cfg.StateDir, id)
		if live {
			continue
		}
		if err := r.cleanRun(id, dir); err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", id, err))
		} else {
			cleaned = append(cleaned, id)
		}
		if lock != nil {
			lock.Close()
		}
	}
	// A uid is reserved by a run (uidpool) from just after its run dir is
	// made to just before it is removed, and by each of its stdio tool
	// servers (its run dir, then "/tool-" and its name) while its process
	// lives: one whose run dir is gone belonged to a run cleaned above
	// (its tool servers' cgroups killed), or to an agentrun that died in
	// between, and no process runs as it any more. A shared tool server's
	// is its agentrun's, reclaimed once that agentrun is gone. The
	// reservations of the host's other state dirs are theirs to reclaim.
	if _, err := r.uids.Reclaim(func(owner string) bool { return deadRunOwner(r.runsDir, owner) }); err != nil {
		errs = append(errs, err)
	}
	if _, err := toolbroker.ReclaimShared(r.uids, toolsDir(r.cfg)); err != nil {
		errs = append(errs, err)
	}
	return cleaned, errors.Join(errs...)
}

// deadRunOwner reports whether owner, a uid reservation's, is a run of
// runsDir (its dir) or a stdio tool server of one (the run's dir, then
// "/tool-" and the server's name) whose run dir is gone.
func deadRunOwner(runsDir, owner string) bool {
	if strings.HasPrefix(filepath.Base(owner), "tool-") {
		owner = filepath.Dir(owner)
	}
	if filepath.Dir(owner) != runsDir {
		return false
	}
	_, err := os.Lstat(owner)
	return errors.Is(err, fs.ErrNotExist)
}

// cleanRun removes one dead run: its container first (which kills its
// processes), then its mounts, then its directory.
func (r *Runner) cleanRun(id, dir string) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(r.leftovers)) {
		if err := r.leftovers[name].Cleanup(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := session.UnmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	if err := r.cleanToolCgroups(id); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
