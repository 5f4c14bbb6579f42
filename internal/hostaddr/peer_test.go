package hostaddr

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRootPeerUID: the owner of a loopback client's socket is told by its
// addresses: one made as uid 2000000007 (this thread's fsuid, which the
// kernel records as the socket's owner), one made as root; an address
// not the host's is not.
func TestRootPeerUID(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("AGENTRUN_TEST_ROOT") == "1" {
			t.Fatal("needs root: a socket made as another user ($AGENTRUN_TEST_ROOT=1)")
		}
		t.Skip("needs root: a socket made as another user")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dial := func(fsuid int) (client, server netip.AddrPort) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		unix.Setfsuid(fsuid)
		c, err := net.Dial("tcp", ln.Addr().String())
		unix.Setfsuid(0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s.RemoteAddr().(*net.TCPAddr).AddrPort(), s.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	for _, want := range []uint32{2000000007, 0} {
		client, server := dial(int(want))
		if uid, ok := PeerUID(client, server); !ok || uid != want {
			t.Errorf("PeerUID(%s, %s) = %d, %v; want %d", client, server, uid, ok, want)
		}
	}
	_, server := dial(0)
	if uid, ok := PeerUID(netip.MustParseAddrPort("192.0.2.1:40000"), server); ok {
		t.Errorf("PeerUID of another host's address = %d; want none", uid)
	}
}
