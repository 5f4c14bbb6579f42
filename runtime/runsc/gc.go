package runsc

import (
	"path/filepath"

	"github.com/agentrun/agentrun/runtime/backend"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/cgroup"
)

// IDs lists the runs that have a bundle under the backend's state dir.
func (b *Backend) IDs() ([]string, error) { return state.IDs(b.stateDir, validID) }

// Cleanup removes run id, left by an agentrun that died: the sandbox (runsc
// delete), every process in its cgroup, the cgroup, the bundle and runsc's
// state. It is not an error if the run is already gone.
func (b *Backend) Cleanup(id string) error {
	cg, err := cgroup.Open(b.cgroupParent() + "/" + id)
	if err != nil {
		return err
	}
	return b.cleanup(id, filepath.Join(b.stateDir, id), cg)
}

// RemoveCgroupParent removes the cgroup that holds the backend's runs'
// cgroups where it is empty, unless a run's cgroup is being made in it:
// runs keep it, as libcontainer's do (runc.Backend.RemoveCgroupParent).
func (b *Backend) RemoveCgroupParent() error {
	return state.RemoveCgroupParent(b.stateDir, func() error { return cgroup.RemoveEmpty(b.cgroupParent()) })
}

// Leftovers is the part of the backend that removes what runsc runs left
// under stateDir and cgroupParent ("" for CgroupParent), for a host where
// runsc cannot run now (runsc.path missing or changed since): it needs no
// runsc binary. Without one, it
// skips `runsc delete` and ends the sandbox through its cgroup, which
// holds every process of it (the sandbox and its gofer), then removes the
// cgroup, the bundle and runsc's state files.
func Leftovers(stateDir, cgroupParent string) backend.Leftovers {
	return &Backend{stateDir: stateDir, root: filepath.Join(stateDir, "root"), parent: cgroupParent}
}
