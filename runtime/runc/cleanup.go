package runc

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// IDs lists the containers that have state under the backend's state dir.
func (b *Backend) IDs() ([]string, error) {
	return state.IDs(b.StateDir, func(string) bool { return true })
}

// Cleanup removes container id, left in the state dir by an agentrun that
// died: it kills every process of the container, destroys it, and removes
// its state and cgroups (and the shared parent cgroup once empty). Calling
// it for a container that is already gone is not an error.
func (b *Backend) Cleanup(id string) error {
	stateDir := b.StateDir
	ctr, err := libcontainer.Load(stateDir, id)
	if err != nil {
		// No usable state (the crash came before state.json was written):
		// find the cgroup by its well-known path.
		cerr := removeCgroup(CgroupParent + "/" + id)
		if rerr := os.RemoveAll(filepath.Join(stateDir, id)); rerr != nil {
			cerr = errors.Join(cerr, rerr)
		}
		removeParents(stateDir, cgroupPaths(CgroupParent+"/"+id))
		return cerr
	}
	var paths map[string]string
	if st, err := ctr.State(); err == nil {
		paths = maps.Clone(st.CgroupPaths)
	}
	_ = ctr.Signal(unix.SIGKILL)
	// agentrun is not the parent of this init: wait for it to go by polling.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := ctr.Status(); err != nil || st == libcontainer.Stopped {
			break
		}
	}
	return destroy(stateDir, ctr, paths)
}

// killAll SIGKILLs every process in m's cgroup, frozen first so that
// nothing forks meanwhile.
func killAll(m cgroups.Manager) {
	_ = m.Freeze(cgroups.Frozen)
	pids, _ := m.GetAllPids()
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	_ = m.Freeze(cgroups.Thawed)
}

// removeCgroup kills every process in the cgroup at path and removes it.
func removeCgroup(path string) error {
	m, err := manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{}})
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	// Not m.Exists: a crash while the cgroup was being made can leave it in
	// some hierarchies only. Destroy removes whatever part exists.
	killAll(m)
	var derr error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if derr = m.Destroy(); derr == nil {
			return nil
		}
	}
	return fmt.Errorf("removing cgroup %s: %w", path, derr)
}

// cgroupPaths returns the paths a cgroup at path has in each hierarchy.
func cgroupPaths(path string) map[string]string {
	m, err := manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{}})
	if err != nil {
		return nil
	}
	return m.GetPaths()
}
