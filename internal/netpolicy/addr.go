package netpolicy

import (
	"fmt"
	"net/netip"
)

// refused lists the ranges that are not globally routable unicast, from the
// IANA IPv4 and IPv6 special-purpose address registries. IPv6 outside
// 2000::/3 is refused separately.
var refused = mustPrefixes(
	// IPv4
	"0.0.0.0/8",       // "this network", unspecified
	"10.0.0.0/8",      // private (RFC 1918)
	"100.64.0.0/10",   // shared address space, CGNAT (RFC 6598); 100.100.100.200 is Alibaba metadata
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local; 169.254.169.254 is cloud metadata
	"172.16.0.0/12",   // private
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // documentation TEST-NET-1
	"192.31.196.0/24", // AS112
	"192.52.193.0/24", // AMT
	"192.88.99.0/24",  // 6to4 relay anycast (deprecated)
	"192.168.0.0/16",  // private
	"192.175.48.0/24", // direct delegation AS112
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // documentation TEST-NET-2
	"203.0.113.0/24",  // documentation TEST-NET-3
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, and 255.255.255.255 broadcast
	// IPv6 inside 2000::/3
	"2001::/23",     // IETF protocol assignments (Teredo 2001::/32 embeds IPv4, ORCHID, ...)
	"2001:db8::/32", // documentation
	"2002::/16",     // 6to4, embeds an IPv4 address
	"3fff::/20",     // documentation
)

var globalUnicast6 = netip.MustParsePrefix("2000::/3")

func mustPrefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}

// CheckAddr returns nil if the proxy may dial ip (and image may fetch from it). It refuses every address
// that is not globally routable unicast: loopback, private (RFC 1918),
// link-local (cloud metadata 169.254.169.254), CGNAT 100.64/10, unique-local
// fc00::/7 (fd00:ec2::254), multicast, unspecified, and the reserved,
// benchmarking (198.18/15) and documentation ranges; IPv4-mapped IPv6
// addresses are judged as the IPv4 address they carry, NAT64, 6to4 and
// Teredo forms are refused. A refused address is allowed if a prefix in
// allow contains it. An address in deny is always refused.
func CheckAddr(ip netip.Addr, allow, deny []netip.Prefix) error {
	if !ip.IsValid() {
		return fmt.Errorf("invalid address")
	}
	if ip.Zone() != "" {
		return fmt.Errorf("address %s is not globally routable", ip)
	}
	ip = ip.Unmap()
	if containsAddr(deny, ip) {
		return fmt.Errorf("address %s is in deny_ranges", ip)
	}
	if containsAddr(allow, ip) {
		return nil
	}
	if ip.Is6() && !globalUnicast6.Contains(ip) || containsAddr(refused, ip) {
		return fmt.Errorf("address %s is not globally routable", ip)
	}
	return nil
}

// containsAddr reports whether a prefix in ps contains ip (already
// unmapped). IPv4-mapped prefixes such as ::ffff:10.0.0.0/104 count as
// their IPv4 form.
func containsAddr(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Dest is what the exact address and port an egress dials may be: the
// ranges of CheckAddr, and never one of the host's own addresses (Own
// says which: loopback, every interface's), unless HostPorts lists that
// address and port exactly. An address of DenyRanges is always refused.
type Dest struct {
	AllowRanges, DenyRanges []netip.Prefix
	// HostPorts are the host's own address:port pairs the operator lets
	// egress reach (network.host_ports); each also passes the ranges.
	HostPorts []netip.AddrPort
	// Own reports whether an address is the host's own; an error refuses.
	Own func(netip.Addr) (bool, error)
}

// ReasonHostOwn starts the refusal of an address of the host itself.
const ReasonHostOwn = "host's own address"

// Check returns nil if ap may be dialled, or why not.
func (d Dest) Check(ap netip.AddrPort) error {
	ip := ap.Addr().Unmap()
	if !ip.IsValid() {
		return fmt.Errorf("invalid address")
	}
	if ip.Zone() != "" {
		return fmt.Errorf("address %s is not globally routable", ip)
	}
	if containsAddr(d.DenyRanges, ip) {
		return fmt.Errorf("address %s is in deny_ranges", ip)
	}
	if d.listed(netip.AddrPortFrom(ip, ap.Port())) {
		return nil
	}
	own, err := d.Own(ip)
	if err != nil {
		return fmt.Errorf("address %s: %s unknown: %w", ip, ReasonHostOwn, err)
	}
	if own {
		return fmt.Errorf("%s %s (network.host_ports does not list %s)", ReasonHostOwn, ip, netip.AddrPortFrom(ip, ap.Port()))
	}
	return CheckAddr(ip, d.AllowRanges, d.DenyRanges)
}

// listed reports whether HostPorts holds ap (IPv4-mapped entries as
// their IPv4 form).
func (d Dest) listed(ap netip.AddrPort) bool {
	for _, hp := range d.HostPorts {
		if hp.Port() == ap.Port() && hp.Addr().Unmap() == ap.Addr() {
			return true
		}
	}
	return false
}
