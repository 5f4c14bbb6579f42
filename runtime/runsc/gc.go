package runsc

import (
	"path/filepath"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/containerd/cgroups/v3"
)

// IDs lists the runs that have a bundle under the backend's state dir.
func (b *Backend) IDs() ([]string, error) { return state.IDs(b.stateDir, validID) }

// Cleanup removes run id, left by an agentrun that died: the sandbox (runsc
// delete), every process in its cgroup, the cgroup, the bundle and runsc's
// state. It is not an error if the run is already gone.
func (b *Backend) Cleanup(id string) error {
	return b.cleanup(id, filepath.Join(b.stateDir, id), existingCgroup(CgroupParent+"/"+id))
}

// existingCgroup is a handle on a cgroup some earlier process made.
func existingCgroup(path string) *sandboxCgroup {
	cg := &sandboxCgroup{path: path, oomFD: -1}
	if cgroups.Mode() == cgroups.Unified {
		cg.dirs = []string{filepath.Join("/sys/fs/cgroup", path)}
	} else {
		cg.dirs = v1Dirs(path)
	}
	return cg
}
