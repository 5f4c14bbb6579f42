package netns

import (
	"fmt"
	"net"
	"sync"
)

// Which names one of the two namespaces of a Net.
type Which int

const (
	// Gateway is the namespace holding "gw0" and agentrun's listeners.
	Gateway Which = iota + 1
	// Sandbox is the namespace the container joins: "lo" and "eth0".
	Sandbox
)

func (w Which) String() string {
	switch w {
	case Gateway:
		return "gateway"
	case Sandbox:
		return "sandbox"
	}
	return fmt.Sprintf("Which(%d)", int(w))
}

// Bounds on the kernel side of the gateway's listeners, set in each gateway
// namespace: the largest TCP receive and send buffer of one socket, and
// the accept queue of one listener.
const (
	GatewaySocketBuffer = 256 << 10
	GatewayBacklog      = 128
)

// Interface names inside the two namespaces.
const (
	GatewayIf = "gw0"
	SandboxIf = "eth0"
)

// Net is one run's pair of anonymous network namespaces (held only by file
// descriptors of this process) joined by a veth created directly inside
// them: it never appears in the host namespace.
type Net struct {
	// SandboxPath is "/proc/<pid>/fd/<n>" of the sandbox namespace, for the
	// OCI spec's network namespace path. Valid until Close.
	SandboxPath string
	// Gateway is the gateway end's address (x.x.x.1 on "gw0").
	Gateway net.IP
	// Sandbox is the sandbox end's address (x.x.x.2 on "eth0").
	Sandbox net.IP

	subnets *Subnets
	idx     int
	gw      nsFD
	sbx     nsFD

	closeOnce sync.Once
	closeErr  error
}

// ns returns the handle of w.
func (n *Net) ns(w Which) (nsFD, error) {
	switch w {
	case Gateway:
		return n.gw, nil
	case Sandbox:
		return n.sbx, nil
	}
	return -1, fmt.Errorf("unknown namespace %v", w)
}
