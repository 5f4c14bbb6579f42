package hostaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
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
	}, watch: func(_, _ func()) error { return errors.New("no subscription") }}
	for i := 0; i < 3; i++ {
		if own, err := s.Own(netip.MustParseAddr("198.18.0.1")); err != nil || !own {
			t.Fatalf("Own = %v, %v", own, err)
		}
	}
	if reads != 1 {
		t.Errorf("%d reads within Refresh, want 1", reads)
	}
	failing := &Set{lister: func() ([]netip.Prefix, error) { return nil, errors.New("no netlink") },
		watch: func(_, _ func()) error { return errors.New("no subscription") }}
	if _, err := failing.Own(netip.MustParseAddr("198.18.0.1")); err == nil {
		t.Error("a failed read gave no error")
	}
	if own, err := failing.Own(netip.MustParseAddr("127.0.0.1")); err != nil || !own {
		t.Errorf("loopback with a failed read: %v, %v; want own", own, err)
	}
}

// Watched, a read lasts until the kernel announces a change, and a
// subscription that ends leaves reads lasting Refresh until the next
// check subscribes again.
func TestSetReadsAgainOnChange(t *testing.T) {
	var changed, ended func()
	subs, reads := 0, 0
	addr := netip.MustParseAddr("198.18.0.7")
	var routes []netip.Prefix
	s := &Set{
		lister: func() ([]netip.Prefix, error) { reads++; return routes, nil },
		watch:  func(c, e func()) error { subs++; changed, ended = c, e; return nil },
	}
	if own, _ := s.Own(addr); own {
		t.Fatal("own before it is added")
	}
	routes = []netip.Prefix{netip.PrefixFrom(addr, 32)}
	if own, _ := s.Own(addr); own || reads != 1 {
		t.Fatalf("unannounced change seen (%v) or read again (%d reads)", own, reads)
	}
	changed()
	if own, _ := s.Own(addr); !own || reads != 2 {
		t.Errorf("after the announcement: own %v, %d reads; want true, 2", own, reads)
	}
	ended()
	s.Own(addr)
	if subs != 2 {
		t.Errorf("%d subscriptions; want a second one after the first ended", subs)
	}
}

// TestOwnSeesAnAddedAddress: an address added to an interface of the
// host's namespace is the host's at once, long before Refresh would
// read the routes again (root: a veth of its own).
func TestOwnSeesAnAddedAddress(t *testing.T) {
	requireRoot(t)
	s := &Set{refresh: time.Hour} // only the subscription can tell
	// Named as test/testenv.FixtureLinkPrefix says (this package cannot
	// import it), so that other packages' leak checks pass over it.
	name := fmt.Sprintf("art-ha%d", os.Getpid()%100000)
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(link)
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr(fmt.Sprintf("198.19.254.%d", 1+os.Getpid()%250))
	if own, err := s.Own(addr); err != nil || own {
		t.Fatalf("Own(%s) before it is added = %v, %v", addr, own, err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if own, err := s.Own(addr); err == nil && own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s added to %s is not the host's own after 10 s", addr, name)
		}
	}
	netlink.LinkDel(link)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if own, err := s.Own(addr); err == nil && !own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still the host's own 10 s after its interface went", addr)
		}
	}
}

// requireRoot is test/testenv's RequireRoot, which imports this package:
// not root, t is skipped, or fails with $AGENTRUN_TEST_ROOT=1.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("AGENTRUN_TEST_ROOT") == "1" {
			t.Fatal("needs root: it adds a veth to the host ($AGENTRUN_TEST_ROOT=1)")
		}
		t.Skip("needs root: it adds a veth to the host")
	}
}
