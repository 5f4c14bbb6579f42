package proxy

import (
	"net"
	"net/netip"
	"sync"
)

// egressKey is an upstream connection by its two ends, the local one
// first; IPv4-mapped addresses are kept as their IPv4 form.
type egressKey struct{ local, remote netip.AddrPort }

// egress holds every upstream connection that a proxy of this process
// has open, so that a server of the same process (serve, reached when
// network.host_ports lists it) can tell a sandbox's connection from its
// other clients at the same address.
var egress = struct {
	mu    sync.Mutex
	conns map[egressKey]struct{}
}{conns: map[egressKey]struct{}{}}

// registerEgress records c, an upstream connection just dialled; false
// when c is not TCP (a test's dialer) and nothing was recorded.
func registerEgress(c net.Conn) (egressKey, bool) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return egressKey{}, false
	}
	k := egressKey{unmapPort(local.AddrPort()), unmapPort(remote.AddrPort())}
	egress.mu.Lock()
	egress.conns[k] = struct{}{}
	egress.mu.Unlock()
	return k, true
}

func unregisterEgress(k egressKey) {
	egress.mu.Lock()
	delete(egress.conns, k)
	egress.mu.Unlock()
}

func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// IsEgress reports whether a connection that a server of this process
// accepted from client at its own address server is one a proxy dialled
// for a sandbox and still holds open: the sandbox's, not the operator's,
// whatever address it comes from.
func IsEgress(client, server netip.AddrPort) bool {
	k := egressKey{local: unmapPort(client), remote: unmapPort(server)}
	egress.mu.Lock()
	defer egress.mu.Unlock()
	_, ok := egress.conns[k]
	return ok
}
