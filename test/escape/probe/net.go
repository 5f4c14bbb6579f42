//go:build linux && amd64

package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// socketProbe: socket(family, type, proto) must fail (item 26).
func socketProbe(id, name string, family, typ, proto int, info bool) probeDef {
	return probeDef{id, name, "sockets", 26, func(p *Probe) {
		p.Info = info
		trySocket(p, uintptr(family), uintptr(typ), uintptr(proto))
		p.ControlOK, p.Control = ctlSockets()
	}}
}

// ctlSockets creates the sockets a sandbox may have: unix, netlink route,
// inet stream.
func ctlSockets() (bool, string) {
	return makeSockets([]sockSpec{
		{"AF_UNIX", unix.AF_UNIX, unix.SOCK_STREAM, 0},
		{"AF_NETLINK/ROUTE", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE},
		{"AF_INET/TCP", unix.AF_INET, unix.SOCK_STREAM, 0},
	})
}

// sockSpec is a socket a control makes: socket(fam, typ, proto).
type sockSpec struct {
	name            string
	fam, typ, proto uintptr
}

// makeSockets makes and closes each socket (close-on-exec) and says
// whether all were made.
func makeSockets(ss []sockSpec) (bool, string) {
	var d []string
	ok := true
	for _, s := range ss {
		r, e := raw(nrSocket, s.fam, s.typ|unix.SOCK_CLOEXEC, s.proto)
		if e == 0 {
			unix.Close(int(r))
		}
		ok = ok && e == 0
		d = append(d, s.name+" "+errOrOK(e))
	}
	return ok, "raw socket(): " + strings.Join(d, ", ")
}

func socketProbes() []probeDef {
	const ethPAll = 0x0300 // htons(ETH_P_ALL)
	return []probeDef{
		socketProbe("socket-packet-raw", "socket(AF_PACKET, SOCK_RAW)", unix.AF_PACKET, unix.SOCK_RAW, ethPAll, false),
		socketProbe("socket-packet-dgram", "socket(AF_PACKET, SOCK_DGRAM)", unix.AF_PACKET, unix.SOCK_DGRAM, ethPAll, false),
		socketProbe("socket-inet-sock-packet", "socket(AF_INET, SOCK_PACKET)", unix.AF_INET, unix.SOCK_PACKET, ethPAll, false),
		socketProbe("socket-inet-raw", "socket(AF_INET, SOCK_RAW, IPPROTO_RAW)", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW, false),
		socketProbe("socket-inet-raw-icmp", "socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP, false),
		socketProbe("socket-inet6-raw", "socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6, false),
		socketProbe("socket-vsock", "socket(AF_VSOCK) (reaches the hypervisor host)", unix.AF_VSOCK, unix.SOCK_STREAM, 0, false),
		socketProbe("socket-alg", "socket(AF_ALG)", unix.AF_ALG, unix.SOCK_SEQPACKET, 0, false),
		socketProbe("socket-key", "socket(AF_KEY)", unix.AF_KEY, unix.SOCK_RAW, 2, false),
		// Families Docker's profile allows and the kernel surface's
		// allowlist refuses (surface.go has the rest).
		socketProbe("socket-bluetooth", "socket(AF_BLUETOOTH)", unix.AF_BLUETOOTH, unix.SOCK_RAW, 0, false),
		socketProbe("socket-can", "socket(AF_CAN)", unix.AF_CAN, unix.SOCK_RAW, 1, false),
		socketProbe("socket-tipc", "socket(AF_TIPC)", unix.AF_TIPC, unix.SOCK_RDM, 0, false),
		socketProbe("socket-rds", "socket(AF_RDS)", unix.AF_RDS, unix.SOCK_SEQPACKET, 0, false),
		socketProbe("socket-xdp", "socket(AF_XDP)", unix.AF_XDP, unix.SOCK_RAW, 0, false),
		// AF_INET is allowed: whether a ping socket is, is the host's
		// net.ipv4.ping_group_range. Recorded as attack surface only.
		socketProbe("socket-inet-ping", "ICMP ping socket (kernel attack surface)", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP, true),
		socketProbe("socket-inet6-ping", "ICMPv6 ping socket (kernel attack surface)", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6, true),
	}
}

// connectTimeout connects a non-blocking socket and waits up to ms; it
// returns 0 when connected and ETIMEDOUT when nothing answered.
func connectTimeout(typ int, addr netip.AddrPort, ms int) unix.Errno {
	fam, sa := sockaddr(addr)
	fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(fd)
	if err = unix.Connect(fd, sa); err == nil {
		return 0
	} else if err != unix.EINPROGRESS {
		return errnoOf(err)
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR {
			continue
		}
		if n == 0 {
			return unix.ETIMEDOUT
		}
		break
	}
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return errnoOf(err)
	}
	return unix.Errno(v)
}

func sockaddr(a netip.AddrPort) (int, unix.Sockaddr) {
	if a.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
}

// ctlLoopback listens on the loopback address of addr's family and connects
// to it: the sandbox's own network works, so a failure elsewhere means
// "no route", not "no networking code".
func ctlLoopback(v6 bool) (bool, string) {
	fam, lo := unix.AF_INET, netip.MustParseAddr("127.0.0.1")
	if v6 {
		fam, lo = unix.AF_INET6, netip.MustParseAddr("::1")
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, "socket: " + err.Error()
	}
	defer unix.Close(fd)
	_, sa := sockaddr(netip.AddrPortFrom(lo, 0))
	if err := unix.Bind(fd, sa); err != nil {
		return false, "bind " + lo.String() + ": " + err.Error()
	}
	if err := unix.Listen(fd, 4); err != nil {
		return false, "listen: " + err.Error()
	}
	got, _ := unix.Getsockname(fd)
	port := 0
	switch s := got.(type) {
	case *unix.SockaddrInet4:
		port = s.Port
	case *unix.SockaddrInet6:
		port = s.Port
	}
	e := connectTimeout(unix.SOCK_STREAM, netip.AddrPortFrom(lo, uint16(port)), 2000)
	return e == 0, fmt.Sprintf("connect to own listener %s:%d: %s", lo, port, errOrOK(e))
}

func tcpProbe(id, name string, item int, target string) probeDef {
	return probeDef{id, name, "network", item, func(p *Probe) {
		ap, err := netip.ParseAddrPort(target)
		if err != nil {
			p.NotProbed = err.Error()
			return
		}
		e := connectTimeout(unix.SOCK_STREAM, ap, 3000)
		p.Errno = ename(e)
		if e == 0 {
			p.Detail = "connected to " + target
		} else {
			p.Blocked, p.Detail = true, fmt.Sprintf("connect %s: %s (%v)", target, ename(e), e)
		}
		p.ControlOK, p.Control = ctlLoopback(false)
	}}
}

func udpProbe(id, name string, target string) probeDef {
	return probeDef{id, name, "network", 32, func(p *Probe) {
		ap := netip.MustParseAddrPort(target)
		fam, sa := sockaddr(ap)
		fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			p.Blocked, p.Errno, p.Detail = true, errName(err), "socket: "+err.Error()
		} else {
			// A DNS query for "." NS.
			q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1}
			err = unix.Sendto(fd, q, 0, sa)
			unix.Close(fd)
			p.Errno = errName(err)
			if err == nil {
				p.Detail = "datagram sent to " + target
			} else {
				p.Blocked, p.Detail = true, fmt.Sprintf("sendto %s: %v", target, err)
			}
		}
		p.ControlOK, p.Control = ctlUDPLoopback()
	}}
}

func ctlUDPLoopback() (bool, string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, err.Error()
	}
	defer unix.Close(fd)
	unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	sa, _ := unix.Getsockname(fd)
	err = unix.Sendto(fd, []byte("x"), 0, sa)
	return err == nil, fmt.Sprintf("sendto own 127.0.0.1 socket: %v", err)
}

func netProbes(o *Options) []probeDef {
	ps := []probeDef{
		tcpProbe("tcp-1.1.1.1-443", "TCP connect 1.1.1.1:443", 32, "1.1.1.1:443"),
		tcpProbe("tcp-10.0.0.1-80", "TCP connect 10.0.0.1:80", 32, "10.0.0.1:80"),
		tcpProbe("tcp-192.168.0.1-80", "TCP connect 192.168.0.1:80", 32, "192.168.0.1:80"),
		tcpProbe("tcp-fd00::1-80", "TCP connect [fd00::1]:80", 32, "[fd00::1]:80"),
		tcpProbe("tcp-2606:4700:4700::1111-443", "TCP connect [2606:4700:4700::1111]:443", 32, "[2606:4700:4700::1111]:443"),
		udpProbe("udp-8.8.8.8-53", "UDP to 8.8.8.8:53", "8.8.8.8:53"),
		udpProbe("udp-2001:4860:4860::8888-53", "UDP to [2001:4860:4860::8888]:53", "[2001:4860:4860::8888]:53"),
		tcpProbe("tcp-metadata-169.254.169.254", "TCP connect 169.254.169.254:80 (cloud metadata)", 35, "169.254.169.254:80"),
		tcpProbe("tcp-metadata-fd00:ec2::254", "TCP connect [fd00:ec2::254]:80 (cloud metadata)", 35, "[fd00:ec2::254]:80"),
		tcpProbe("tcp-metadata-100.100.100.200", "TCP connect 100.100.100.200:80 (cloud metadata)", 35, "100.100.100.200:80"),
		{"netns-only-lo", "the network namespace holds only lo and no routes", "network", 32, func(p *Probe) {
			ifs, e := listDir("/sys/class/net")
			route, re := readAll("/proc/net/route", 1<<16)
			route6, _ := readAll("/proc/net/ipv6_route", 1<<16)
			lines := strings.Split(strings.TrimSpace(string(route)), "\n")
			nroutes := len(lines) - 1
			var v6 []string
			for _, l := range strings.Split(strings.TrimSpace(string(route6)), "\n") {
				if f := strings.Fields(l); len(f) == 10 && f[9] != "lo" {
					v6 = append(v6, f[9])
				}
			}
			p.ControlOK = e == 0 && re == 0 && len(ifs) > 0
			p.Control = fmt.Sprintf("/sys/class/net listed (%s), /proc/net/route read (%s)", errOrOK(e), errOrOK(re))
			p.Blocked = len(ifs) == 1 && ifs[0] == "lo" && nroutes == 0 && len(v6) == 0
			p.Detail = fmt.Sprintf("interfaces %v; %d IPv4 routes; IPv6 routes via %v", ifs, nroutes, v6)
		}},
	}
	if o.HostPort > 0 {
		port := strconv.Itoa(o.HostPort)
		ps = append(ps, tcpProbe("tcp-loopback-hostport", "TCP connect 127.0.0.1:"+port+" (the host's listener must not be there)", 33, "127.0.0.1:"+port))
		for _, ip := range o.HostIPs {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				continue
			}
			ps = append(ps, tcpProbe("tcp-host-"+ip, "TCP connect to the host's "+ip+":"+port, 33, netip.AddrPortFrom(a, uint16(o.HostPort)).String()))
		}
	}
	ps = append(ps, probeDef{"abstract-unix-host", "connect to the host's abstract unix socket (CVE-2020-15257)", "network", 34, func(p *Probe) {
		// Control: an abstract socket of our own answers.
		own := fmt.Sprintf("@agentrun-probe-ctl-%d", unix.Getpid())
		l, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			defer unix.Close(l)
			if err = unix.Bind(l, &unix.SockaddrUnix{Name: own}); err == nil {
				err = unix.Listen(l, 1)
			}
		}
		cerr := connectUnix(own)
		p.ControlOK = err == nil && cerr == nil
		p.Control = fmt.Sprintf("bind+listen %s: %v; connect to it: %v", own, err, cerr)
		if o.Abstract == "" {
			p.NotProbed = "no -abstract name given"
			return
		}
		err = connectUnix("@" + strings.TrimPrefix(o.Abstract, "@"))
		p.Errno = errName(err)
		if err == nil {
			p.Detail = "connected to @" + o.Abstract
			return
		}
		p.Blocked, p.Detail = true, fmt.Sprintf("connect @%s: %v", strings.TrimPrefix(o.Abstract, "@"), err)
	}})
	return ps
}

func connectUnix(name string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: name})
}
