//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The kernel surface's allowlist (item 36): socket families and netlink
// protocols past AF_UNIX, AF_INET, AF_INET6 and NETLINK_ROUTE, protocols
// and types of AF_INET and AF_INET6 past TCP, UDP and ping, socketpair
// past AF_UNIX, the tty ioctls TIOCSTI, TIOCLINUX and TIOCSETD, and
// setsockopt(TCP_ULP). The expectation table pins each errno: the kernel
// itself refuses some of these with another errno, and only the filter's
// answer proves the filter refused them.

const (
	nrIoctl      = 16
	nrSetsockopt = 54
	nrSocketpair = 53

	// upper32 sets the bits of a 64-bit argument that the kernel drops
	// from an int or unsigned int.
	upper32 = uintptr(0xffff_ffff) << 32

	tcpULP = 31 // TCP_ULP
)

func surfaceProbes() []probeDef {
	ps := []probeDef{
		surfaceSocket("socket-netlink-xfrm", "socket(AF_NETLINK, NETLINK_XFRM)", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM),
		surfaceSocket("socket-netlink-netfilter", "socket(AF_NETLINK, NETLINK_NETFILTER)", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER),
		surfaceSocket("socket-netlink-audit", "socket(AF_NETLINK, NETLINK_AUDIT)", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT),
		surfaceSocket("socket-netlink-generic", "socket(AF_NETLINK, NETLINK_GENERIC)", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC),
		surfaceSocket("socket-netlink-uevent", "socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)", unix.AF_NETLINK, unix.SOCK_DGRAM, unix.NETLINK_KOBJECT_UEVENT),
		surfaceSocket("socket-netlink-xfrm-upper", "socket(AF_NETLINK, NETLINK_XFRM with the upper 32 bits set)", unix.AF_NETLINK, unix.SOCK_RAW, upper32|unix.NETLINK_XFRM),
		surfaceSocket("socket-rxrpc", "socket(AF_RXRPC)", unix.AF_RXRPC, unix.SOCK_DGRAM, unix.AF_INET),
		surfaceSocket("socket-kcm", "socket(AF_KCM)", unix.AF_KCM, unix.SOCK_DGRAM, 0),
		surfaceSocket("socket-family-max", "socket(AF_MAX)", unix.AF_MAX, unix.SOCK_STREAM, 0),
		surfaceSocket("socket-family-200", "socket(200)", 200, unix.SOCK_STREAM, 0),
		surfaceSocket("socket-alg-upper", "socket(AF_ALG with the upper 32 bits set)", upper32|unix.AF_ALG, unix.SOCK_SEQPACKET, 0),
		inetSocket("socket-inet-mptcp", "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP),
		inetSocket("socket-inet6-mptcp", "socket(AF_INET6, SOCK_STREAM, IPPROTO_MPTCP)", unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP),
		inetSocket("socket-inet-mptcp-upper", "socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP with the upper 32 bits set)", unix.AF_INET, unix.SOCK_STREAM, upper32|unix.IPPROTO_MPTCP),
		inetSocket("socket-inet-udplite", "socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE)", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE),
		inetSocket("socket-inet6-udplite", "socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDPLITE)", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE),
		inetSocket("socket-inet-sctp", "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP),
		inetSocket("socket-inet-sctp-seqpacket", "socket(AF_INET, SOCK_SEQPACKET, IPPROTO_SCTP)", unix.AF_INET, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP),
		inetSocket("socket-inet6-sctp-seqpacket", "socket(AF_INET6, SOCK_SEQPACKET, IPPROTO_SCTP)", unix.AF_INET6, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP),
		inetSocket("socket-inet-dccp", "socket(AF_INET, SOCK_DCCP, IPPROTO_DCCP)", unix.AF_INET, unix.SOCK_DCCP, unix.IPPROTO_DCCP),
		inetSocket("socket-inet6-dccp", "socket(AF_INET6, SOCK_DCCP, IPPROTO_DCCP)", unix.AF_INET6, unix.SOCK_DCCP, unix.IPPROTO_DCCP),
		{"socketpair-inet", "socketpair(AF_INET)", "sockets", 36, func(p *Probe) {
			e := socketpair(unix.AF_INET)
			p.Errno = ename(e)
			p.Blocked, p.Detail = e != 0, "socketpair(AF_INET): "+errOrOK(e)
			ce := socketpair(unix.AF_UNIX)
			p.ControlOK, p.Control = ce == 0, "socketpair(AF_UNIX): "+errOrOK(ce)
		}},
		{"setsockopt-tcp-ulp", `setsockopt(TCP_ULP, "tls") on a connected TCP socket`, "sockets", 36, func(p *Probe) { tcpULPProbe(p, 0) }},
		{"setsockopt-tcp-ulp-upper", `setsockopt(TCP_ULP, "tls"), level and option with the upper 32 bits set`, "sockets", 36, func(p *Probe) { tcpULPProbe(p, upper32) }},
	}
	for _, c := range []struct {
		id, name string
		cmd      uintptr
		arg      byte
	}{
		{"ioctl-tiocsti", "TIOCSTI (push input into the terminal)", unix.TIOCSTI, 'x'},
		{"ioctl-tioclinux", "TIOCLINUX (virtual console selection and keyboard)", unix.TIOCLINUX, 6}, // TIOCL_GETSHIFTSTATE
		{"ioctl-tiocsetd", "TIOCSETD (attach a line discipline)", unix.TIOCSETD, 0},                  // N_TTY
	} {
		ps = append(ps,
			ttyIoctlProbe(c.id, "ioctl "+c.name+" on the controlling pty", c.cmd, c.arg),
			ttyIoctlProbe(c.id+"-upper", "ioctl "+c.name+" with the upper 32 bits of the command set", upper32|c.cmd, c.arg))
	}
	return ps
}

// surfaceSocket: socket(family, typ, proto) fails; the control creates
// the sockets a sandbox may have.
func surfaceSocket(id, name string, family, typ, proto uintptr) probeDef {
	return probeDef{id, name, "sockets", 36, func(p *Probe) {
		trySocket(p, family, typ, proto)
		p.ControlOK, p.Control = ctlSockets()
	}}
}

// inetSocket: socket(family, typ, proto) of AF_INET or AF_INET6 with a
// protocol or type past TCP, UDP and ping fails; the control creates TCP
// and UDP sockets of both families, with protocol 0 and with its
// explicit number, blocking and not.
func inetSocket(id, name string, family, typ, proto uintptr) probeDef {
	return probeDef{id, name, "sockets", 36, func(p *Probe) {
		trySocket(p, family, typ, proto)
		p.ControlOK, p.Control = ctlInetSockets()
	}}
}

// trySocket makes socket(family, typ, proto) and records the result.
func trySocket(p *Probe, family, typ, proto uintptr) {
	r, e := raw(nrSocket, family, typ|unix.SOCK_CLOEXEC, proto)
	p.Errno = ename(e)
	if e == 0 {
		unix.Close(int(r))
		p.Detail = "socket created"
	} else {
		p.Blocked, p.Detail = true, fmt.Sprintf("%s (%v)", ename(e), e)
	}
}

// ctlInetSockets makes the TCP and UDP sockets a sandbox may have.
func ctlInetSockets() (bool, string) {
	var ss []sockSpec
	for _, fam := range []sockSpec{{"AF_INET", unix.AF_INET, 0, 0}, {"AF_INET6", unix.AF_INET6, 0, 0}} {
		ss = append(ss,
			sockSpec{fam.name + " TCP/0", fam.fam, unix.SOCK_STREAM, 0},
			sockSpec{fam.name + " TCP/IPPROTO_TCP", fam.fam, unix.SOCK_STREAM | unix.SOCK_NONBLOCK, unix.IPPROTO_TCP},
			sockSpec{fam.name + " UDP/0", fam.fam, unix.SOCK_DGRAM | unix.SOCK_NONBLOCK, 0},
			sockSpec{fam.name + " UDP/IPPROTO_UDP", fam.fam, unix.SOCK_DGRAM, unix.IPPROTO_UDP})
	}
	return makeSockets(ss)
}

// socketpair makes a stream pair of family and closes it.
func socketpair(family uintptr) unix.Errno {
	var fds [2]int32
	_, e := raw(nrSocketpair, family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, pin(&fds))
	if e == 0 {
		unix.Close(int(fds[0]))
		unix.Close(int(fds[1]))
	}
	return e
}

// tcpULPProbe sets TCP_ULP "tls" on a TCP connection over the loopback
// (the kernel refuses it on a socket not connected), level and option
// with upper set; the control sets TCP_NODELAY on the same socket.
func tcpULPProbe(p *Probe, upper uintptr) {
	fd, cleanup, err := loopbackConn()
	if err != nil {
		p.NotProbed = "no loopback connection: " + err.Error()
		return
	}
	defer cleanup()
	tls := []byte("tls\x00")
	_, e := raw(nrSetsockopt, uintptr(fd), upper|unix.SOL_TCP, upper|tcpULP, pin(&tls[0]), 3)
	p.Errno = ename(e)
	p.Blocked, p.Detail = e != 0, `setsockopt(SOL_TCP, TCP_ULP, "tls"): `+errOrOK(e)
	one := int32(1)
	_, ce := raw(nrSetsockopt, uintptr(fd), unix.SOL_TCP, unix.TCP_NODELAY, pin(&one), 4)
	p.ControlOK, p.Control = ce == 0, "setsockopt(SOL_TCP, TCP_NODELAY) on the same socket: "+errOrOK(ce)
}

// loopbackConn returns the client end of a TCP connection to a listener
// of its own on 127.0.0.1.
func loopbackConn() (int, func(), error) {
	l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, nil, err
	}
	fail := func(err error) (int, func(), error) { unix.Close(l); return -1, nil, err }
	if err := unix.Bind(l, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fail(err)
	}
	if err := unix.Listen(l, 1); err != nil {
		return fail(err)
	}
	sa, err := unix.Getsockname(l)
	if err != nil {
		return fail(err)
	}
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	if err := unix.Connect(c, sa); err != nil {
		unix.Close(c)
		return fail(err)
	}
	return c, func() { unix.Close(c); unix.Close(l) }, nil
}

// ttyIoctlProbe runs ioctl(cmd, &arg) in a child whose controlling
// terminal is a new pty's terminal end (where the kernel lets TIOCSTI
// through); the control is that the pty is the child's controlling
// terminal (TIOCGPGRP) and that TCGETS works on it.
func ttyIoctlProbe(id, name string, cmd uintptr, arg byte) probeDef {
	return probeDef{id, name, "ioctl", 36, func(p *Probe) {
		pty, err := openPty()
		if err != nil {
			p.NotProbed = err.Error()
			return
		}
		defer unix.Close(pty.master)
		defer unix.Close(pty.tty)
		ws, out, err := runChild([]string{selfExe, "-ioctl", strconv.FormatUint(uint64(cmd), 10), strconv.Itoa(int(arg))},
			&syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 3}, []uintptr{uintptr(pty.tty)})
		if err != nil {
			p.NotProbed = "starting the child: " + err.Error()
			return
		}
		// The child prints "ERRNO CONTROL-ERRNO SID-MATCH".
		f := strings.Fields(out)
		if !ws.Exited() || ws.ExitStatus() != 0 || len(f) != 3 {
			p.Detail = fmt.Sprintf("child %s: %q", describeWait(ws), out)
			return
		}
		if p.Blocked = f[0] != "ok"; p.Blocked {
			p.Errno = f[0]
		}
		p.Detail = fmt.Sprintf("ioctl(%#x) on the child's controlling pty: %s", cmd, f[0])
		p.ControlOK = f[1] == "ok" && f[2] == "ctty"
		p.Control = fmt.Sprintf("TCGETS on it: %s; the child's controlling terminal (TIOCGPGRP is its process group): %s", f[1], f[2])
	}}
}

type pty struct{ master, tty int }

// openPty opens a new pty (master and terminal end, not as a controlling
// terminal).
func openPty() (pty, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pty{}, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	n, err := unix.IoctlGetInt(m, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0)
	}
	if err != nil {
		unix.Close(m)
		return pty{}, fmt.Errorf("ptmx ioctls: %w", err)
	}
	t, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(m)
		return pty{}, fmt.Errorf("open /dev/pts/%d: %w", n, err)
	}
	return pty{m, t}, nil
}

// ioctlChild is the child of ttyIoctlProbe: fd 3 is its controlling
// terminal. It prints the probe's errno ("ok" if none), the control
// ioctl's, and "ctty" if the terminal's foreground process group is its
// own.
func ioctlChild(args []string) {
	if len(args) != 2 {
		os.Exit(2)
	}
	cmd, err1 := strconv.ParseUint(args[0], 10, 64)
	arg, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil {
		os.Exit(2)
	}
	word := func(e unix.Errno) string {
		if e == 0 {
			return "ok"
		}
		return ename(e)
	}
	var t unix.Termios
	_, ce := raw(nrIoctl, 3, unix.TCGETS, pin(&t))
	// The foreground process group of a terminal that is not the
	// caller's controlling terminal is ENOTTY.
	var pgrp int32
	_, ge := raw(nrIoctl, 3, unix.TIOCGPGRP, pin(&pgrp))
	ctty := "not-ctty"
	switch {
	case ge == 0 && int(pgrp) == unix.Getpgrp():
		ctty = "ctty"
	case ge != 0:
		ctty = "TIOCGPGRP:" + ename(ge)
	}
	b := [8]byte{byte(arg)}
	_, e := raw(nrIoctl, 3, uintptr(cmd), pin(&b[0]))
	fmt.Printf("%s %s %s\n", word(e), word(ce), ctty)
	os.Exit(0)
}
