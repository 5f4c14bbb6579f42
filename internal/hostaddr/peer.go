package hostaddr

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// PeerUID says which user of this host owns the socket at the other end of
// a TCP connection accepted from client at server: the uid the kernel of
// this network namespace recorded when that socket was made, asked of it
// over sock_diag. Only a client at an address of the host's own (Own) has
// its socket here; for any other, or when the kernel does not tell it
// exactly, ok is false.
func PeerUID(client, server netip.AddrPort) (uid uint32, ok bool) {
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	server = netip.AddrPortFrom(server.Addr().Unmap(), server.Port())
	if own, err := Own(client.Addr()); err != nil || !own || client.Addr().Is4() != server.Addr().Is4() {
		return 0, false
	}
	c, s := net.TCPAddrFromAddrPort(client), net.TCPAddrFromAddrPort(server)
	sock, err := netlink.SocketGet(c, s)
	if err != nil {
		return 0, false
	}
	// A dump matches the ports alone: the addresses are checked here.
	if !sock.ID.Source.Equal(c.IP) || int(sock.ID.SourcePort) != c.Port ||
		!sock.ID.Destination.Equal(s.IP) || int(sock.ID.DestinationPort) != s.Port {
		return 0, false
	}
	return sock.UID, true
}
