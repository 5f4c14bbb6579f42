package runsc

import (
	"path/filepath"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/cgroup"
)

// IDs lists the runs that have a bundle under the backend's state dir.
func (b *Backend) IDs() ([]string, error) { return state.IDs(b.stateDir, validID) }

// Cleanup removes run id, left by an agentrun that died: the sandbox (runsc
// delete), every process in its cgroup, the cgroup, the bundle and runsc's
// state. It is not an error if the run is already gone.
func (b *Backend) Cleanup(id string) error {
	cg, err := cgroup.Open(CgroupParent + "/" + id)
	if err != nil {
		return err
	}
	return b.cleanup(id, filepath.Join(b.stateDir, id), cg)
}
