package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCheckAddr(t *testing.T) {
	refused := []string{
		"127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1",
		"10.0.0.1", "::ffff:10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "::ffff:169.254.169.254", "fe80::1", "fd00:ec2::254", "fc00::1",
		"100.64.0.1", "100.100.100.200", "100.127.255.255",
		"0.0.0.0", "0.1.2.3", "::", "224.0.0.1", "239.255.255.250", "ff02::1", "255.255.255.255", "240.0.0.1",
		"192.0.0.1", "192.0.2.1", "198.18.0.1", "198.19.255.255", "198.51.100.1", "203.0.113.1",
		"2001:db8::1", "2002:7f00:1::", "2001:0:4136:e378::1", "64:ff9b::a00:1", "100::1", "3fff::1", "fec0::1",
		"::127.0.0.1",
	}
	for _, s := range refused {
		if err := CheckAddr(netip.MustParseAddr(s), nil, nil); err == nil {
			t.Errorf("CheckAddr(%s) = nil; want refused", s)
		} else if !strings.Contains(err.Error(), "not globally routable") {
			t.Errorf("CheckAddr(%s) = %q; want \"not globally routable\"", s, err)
		}
	}
	allowed := []string{"8.8.8.8", "1.1.1.1", "151.101.0.223", "::ffff:8.8.8.8", "2606:4700:4700::1111", "172.32.0.1", "100.128.0.1", "198.20.0.1"}
	for _, s := range allowed {
		if err := CheckAddr(netip.MustParseAddr(s), nil, nil); err != nil {
			t.Errorf("CheckAddr(%s) = %v; want nil", s, err)
		}
	}
	if err := CheckAddr(netip.Addr{}, nil, nil); err == nil {
		t.Error("CheckAddr(invalid) = nil; want an error")
	}
	if err := CheckAddr(netip.MustParseAddr("fe80::1%eth0"), []netip.Prefix{netip.MustParsePrefix("fe80::/10")}, nil); err == nil {
		t.Error("CheckAddr with a zone = nil; want refused")
	}
}

func TestCheckAddrRanges(t *testing.T) {
	bench := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	if err := CheckAddr(netip.MustParseAddr("198.18.0.2"), bench, nil); err != nil {
		t.Errorf("allow_ranges 198.18.0.0/15: CheckAddr(198.18.0.2) = %v; want nil", err)
	}
	if err := CheckAddr(netip.MustParseAddr("::ffff:198.18.0.2"), bench, nil); err != nil {
		t.Errorf("allow_ranges 198.18.0.0/15: CheckAddr(::ffff:198.18.0.2) = %v; want nil", err)
	}
	if err := CheckAddr(netip.MustParseAddr("10.0.0.1"), bench, nil); err == nil {
		t.Error("allow_ranges 198.18.0.0/15 opened 10.0.0.1")
	}
	// Deny wins over allow and over global addresses.
	deny := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("8.8.8.0/24")}
	for _, s := range []string{"198.18.0.2", "8.8.8.8", "::ffff:8.8.8.8"} {
		err := CheckAddr(netip.MustParseAddr(s), bench, deny)
		if err == nil || !strings.Contains(err.Error(), "deny_ranges") {
			t.Errorf("CheckAddr(%s) with deny = %v; want deny_ranges refusal", s, err)
		}
	}
	// IPv4-mapped prefixes work as their IPv4 form.
	mapped := []netip.Prefix{netip.MustParsePrefix("::ffff:1.2.3.0/120")}
	if err := CheckAddr(netip.MustParseAddr("1.2.3.4"), nil, mapped); err == nil {
		t.Error("deny ::ffff:1.2.3.0/120 did not refuse 1.2.3.4")
	}
	if err := CheckAddr(netip.MustParseAddr("1.2.4.4"), nil, mapped); err != nil {
		t.Errorf("deny ::ffff:1.2.3.0/120 refused 1.2.4.4: %v", err)
	}
}

// The host's own addresses are refused whatever the ranges say, unless
// host_ports lists that exact address and port; deny_ranges still wins.
func TestDestHostOwn(t *testing.T) {
	own := netip.MustParseAddr("198.18.0.1")
	d := Dest{
		AllowRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		HostPorts:   []netip.AddrPort{netip.MustParseAddrPort("198.18.0.1:4222")},
		Own:         func(a netip.Addr) (bool, error) { return a == own || a.IsLoopback(), nil },
	}
	for _, s := range []string{"198.18.0.1:80", "[::ffff:198.18.0.1]:80", "127.0.0.1:4222"} {
		if err := d.Check(netip.MustParseAddrPort(s)); err == nil || !strings.Contains(err.Error(), ReasonHostOwn) {
			t.Errorf("Check(%s) = %v; want %q", s, err, ReasonHostOwn)
		}
	}
	for _, s := range []string{"198.18.0.1:4222", "[::ffff:198.18.0.1]:4222", "198.18.0.2:80"} {
		if err := d.Check(netip.MustParseAddrPort(s)); err != nil {
			t.Errorf("Check(%s) = %v; want nil", s, err)
		}
	}
	d.DenyRanges = []netip.Prefix{netip.MustParsePrefix("198.18.0.1/32")}
	if err := d.Check(netip.MustParseAddrPort("198.18.0.1:4222")); err == nil {
		t.Error("deny_ranges did not win over host_ports")
	}
}
