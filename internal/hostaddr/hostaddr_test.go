package hostaddr

import (
	"errors"
	"net"
	"net/netip"
	"testing"
)

// Every address of every interface, loopback and the whole of
// 127.0.0.0/8 are the host's; a documentation address is not.
func TestOwnInterfaceAddrs(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(ipn.IP)
		if ip.IsLinkLocalUnicast() && ip.Is6() {
			continue // scoped: the local table holds it with its zone
		}
		if own, err := Own(ip); err != nil || !own {
			t.Errorf("Own(%s) = %v, %v; want true: an interface's address", ip, own, err)
		}
	}
	for _, s := range []string{"127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::", "::ffff:0.0.0.0"} {
		if own, err := Own(netip.MustParseAddr(s)); err != nil || !own {
			t.Errorf("Own(%s) = %v, %v; want true", s, own, err)
		}
	}
	for _, s := range []string{"192.0.2.1", "2001:db8::1"} {
		if own, err := Own(netip.MustParseAddr(s)); err != nil || own {
			t.Errorf("Own(%s) = %v, %v; want false", s, own, err)
		}
	}
}

// A read is used for Refresh, and a failed read refuses (an error), not
// lets through.
func TestSetReadsOncePerRefresh(t *testing.T) {
	reads := 0
	s := &Set{lister: func() ([]netip.Prefix, error) {
		reads++
		return []netip.Prefix{netip.MustParsePrefix("198.18.0.1/32")}, nil
	}}
	for i := 0; i < 3; i++ {
		if own, err := s.Own(netip.MustParseAddr("198.18.0.1")); err != nil || !own {
			t.Fatalf("Own = %v, %v", own, err)
		}
	}
	if reads != 1 {
		t.Errorf("%d reads within Refresh, want 1", reads)
	}
	failing := &Set{lister: func() ([]netip.Prefix, error) { return nil, errors.New("no netlink") }}
	if _, err := failing.Own(netip.MustParseAddr("198.18.0.1")); err == nil {
		t.Error("a failed read gave no error")
	}
	if own, err := failing.Own(netip.MustParseAddr("127.0.0.1")); err != nil || !own {
		t.Errorf("loopback with a failed read: %v, %v; want own", own, err)
	}
}
