package runc

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/cgroup"
)

// IDs lists the containers that have state under the backend's state dir.
func (b *Backend) IDs() ([]string, error) {
	return state.IDs(b.StateDir, func(string) bool { return true })
}

// Cleanup removes container id, left in the state dir by an agentrun that
// died: it kills every process of the container through its cgroup,
// destroys the container, and removes its state and cgroups. Calling it
// for a container that is already gone is not an error.
func (b *Backend) Cleanup(id string) error {
	stateDir := b.StateDir
	ctr, lerr := libcontainer.Load(stateDir, id)
	path := b.cgroupParent() + "/" + id
	if lerr == nil && ctr.Config().Cgroups != nil {
		path = ctr.Config().Cgroups.Path
	}
	cg, err := cgroup.Open(path)
	if err != nil {
		return err
	}
	kerr := cg.Kill()
	if lerr != nil {
		// No usable state (the crash came before state.json was written):
		// the cgroup is found by its well-known path.
		errs := []error{kerr, cg.Remove()}
		if err := os.RemoveAll(filepath.Join(stateDir, id)); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	_ = ctr.Signal(unix.SIGKILL)
	// agentrun is not the parent of this init: wait for it to go by polling
	// (a killed cgroup of many processes takes a while on a loaded host).
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := ctr.Status(); err != nil || st == libcontainer.Stopped {
			break
		}
	}
	return errors.Join(kerr, destroy(stateDir, ctr, cg))
}
