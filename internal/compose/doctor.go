package compose

import (
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/runtime/runc"
)

// Doctor is the machinery that doctor tries the host with
// (doctor.Machinery): the very packages and calls a run uses.
type Doctor struct{}

// Network makes a run's network, a sandbox and a gateway namespace with a
// veth between them (netns), and removes it.
func (Doctor) Network() error {
	nets, err := netns.NewSubnets(netns.DefaultCIDR)
	if err != nil {
		return err
	}
	n, err := nets.Setup()
	if err != nil {
		return err
	}
	return n.Close()
}

// SeccompHelper is the package's SeccompHelper.
func (Doctor) SeccompHelper(cfg *config.Config) (string, error) { return SeccompHelper(cfg) }

// PrecompiledSeccomp compiles the sandbox's seccomp filter for helper to
// load, as a libcontainer run does.
func (Doctor) PrecompiledSeccomp(helper string) error {
	return (&runc.Backend{SeccompHelper: helper}).PrecompiledSeccomp()
}

// SealBinary seals this binary in dir as libcontainer does for every
// container's init (runc.SealSelf).
func (Doctor) SealBinary(dir string) (copied bool, size int64, err error) { return runc.SealSelf(dir) }
