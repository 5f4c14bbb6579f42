package spec

import (
	"math/bits"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The kernel surface a sandbox reaches through sockets, ioctls and socket
// options is an allowlist, not Docker's denylist: the shared-kernel
// escapes went through code any unprivileged process can reach (socket
// families such as AF_ALG, RxRPC, AF_KEY and xfrm netlink, line
// disciplines, TCP upper-layer protocols).
//
//   - socket: AF_UNIX, AF_INET, AF_INET6, and AF_NETLINK with
//     NETLINK_ROUTE only (libc's resolver and getifaddrs use it). Another
//     netlink protocol fails with EPROTONOSUPPORT, another family (AF_MAX
//     and above included) with EAFNOSUPPORT: what a kernel without them
//     answers, so a program falls back as it would there. AF_INET and
//     AF_INET6 are TCP, UDP and the ICMP echo (ping) socket only
//     (inetRules): another protocol (MPTCP, UDP-Lite, SCTP) fails with
//     EPROTONOSUPPORT, another type (SCTP's SOCK_SEQPACKET, SOCK_DCCP)
//     with ESOCKTNOSUPPORT, SOCK_RAW with EPERM (what the kernel answers a
//     process without CAP_NET_RAW).
//   - socketpair: AF_UNIX only, else EAFNOSUPPORT.
//   - ioctl: TIOCSTI, TIOCLINUX and TIOCSETD are refused (EPERM) whatever
//     the upper 32 bits of the command (the kernel reads an unsigned int).
//   - setsockopt: TCP_ULP at level SOL_TCP is refused (EPERM), whatever
//     the upper 32 bits of either (the kernel reads ints).
//
// The filter is compiled by libseccomp (2.5 at least): one comparison per
// argument per rule, and an unconditional rule for a syscall wipes its
// conditional ones. So these four syscalls have no unconditional rule, and
// their rules never overlap: every argument value meets exactly one rule,
// or none and the filter's default action (EPERM). A bounded range is a
// union of aligned blocks, each one masked comparison (maskedRange).

// surfaceSyscalls are the syscalls whose rules surfaceRules makes: no
// other rule of the filter may name them.
var surfaceSyscalls = []string{"socket", "socketpair", "ioctl", "setsockopt"}

// Refused ioctl commands (include/uapi/asm-generic/ioctls.h): TIOCSTI
// pushes input into a terminal, TIOCLINUX reaches the virtual console's
// selection and keyboard code, TIOCSETD attaches a line discipline.
var refusedIoctls = []uint64{unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD}

// tcpULP is TCP_ULP (include/uapi/linux/tcp.h): it attaches an upper-layer
// protocol (kTLS, MPTCP's subflows) to a TCP socket.
const tcpULP = 31

// low32 compares the 32 bits of an argument the kernel reads as an int or
// an unsigned int.
const low32 = 0xffff_ffff

// surfaceRules are the rules of surfaceSyscalls.
func surfaceRules() []specs.LinuxSyscall {
	return slices.Concat(socketRules(), socketpairRules(), ioctlRules(), setsockoptRules())
}

func socketRules() []specs.LinuxSyscall {
	allow := func(args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow, Args: args}
	}
	family := func(f uint64) specs.LinuxSeccompArg { return eq(0, f) }
	rs := []specs.LinuxSyscall{
		allow(family(unix.AF_UNIX)),
		allow(family(unix.AF_NETLINK), eq(2, unix.NETLINK_ROUTE)),
		errnoRule("socket", unix.EPROTONOSUPPORT, family(unix.AF_NETLINK), gt(2, unix.NETLINK_ROUTE)),
	}
	rs = append(rs, inetRules(unix.AF_INET, unix.IPPROTO_ICMP)...)
	rs = append(rs, inetRules(unix.AF_INET6, unix.IPPROTO_ICMPV6)...)
	// Every other family: AF_UNSPEC (0), the gaps between the allowed
	// ones, and everything past AF_NETLINK, however large.
	noFamily := []specs.LinuxSeccompArg{eq(0, unix.AF_UNSPEC), gt(0, unix.AF_NETLINK)}
	noFamily = append(noFamily, maskedRange(0, unix.AF_INET+1, unix.AF_INET6, ^uint64(0))...)
	noFamily = append(noFamily, maskedRange(0, unix.AF_INET6+1, unix.AF_NETLINK, ^uint64(0))...)
	for _, a := range noFamily {
		rs = append(rs, errnoRule("socket", unix.EAFNOSUPPORT, a))
	}
	return rs
}

// sockTypeMask is SOCK_TYPE_MASK (include/linux/net.h): the kernel reads
// a socket's type from these bits of the int type argument; the rest are
// SOCK_NONBLOCK and SOCK_CLOEXEC, or an EINVAL of the kernel's.
const sockTypeMask = 0xf

// inetRules are socket's rules for family (AF_INET or AF_INET6), whose
// ping protocol is ping. The family's protocols are kernel code of their
// own that any process reaches, loaded on demand as modules where they
// are not built in: a sandbox gets TCP, UDP and ping, the protocols that
// protocol 0 of a stream or datagram socket stands for and the one
// unprivileged ICMP socket, and nothing else:
//
//   - SOCK_STREAM with protocol 0 or IPPROTO_TCP; another protocol
//     (IPPROTO_MPTCP, IPPROTO_SCTP) fails with EPROTONOSUPPORT;
//   - SOCK_DGRAM with protocol 0, IPPROTO_UDP or ping (whether a ping
//     socket is made is then the host's net.ipv4.ping_group_range, as
//     before); another (IPPROTO_UDPLITE) fails with EPROTONOSUPPORT;
//   - SOCK_RAW fails with EPERM, as the kernel answers without
//     CAP_NET_RAW, whatever the protocol;
//   - any other type (SOCK_SEQPACKET, SOCK_DCCP, SOCK_RDM, SOCK_PACKET,
//     SOCK_TYPE_MASK's unused values) fails with ESOCKTNOSUPPORT.
//
// A protocol is allowed only with its upper 32 bits clear (libc and Go
// pass a non-negative int); one with upper bits set is refused whatever
// the kernel would read. The type is compared through sockTypeMask, so
// SOCK_NONBLOCK and SOCK_CLOEXEC pass, as do bits the kernel refuses
// with EINVAL itself.
func inetRules(family, ping uint64) []specs.LinuxSyscall {
	fam := eq(0, family)
	typ := func(t uint64) specs.LinuxSeccompArg { return masked(1, sockTypeMask, t) }
	var rs []specs.LinuxSyscall
	// protocols allows type t with each of protos (ascending) and refuses
	// it with every other protocol: the gaps between them, and everything
	// above the last, however large.
	protocols := func(t uint64, protos ...uint64) {
		lo := uint64(0)
		for _, p := range protos {
			rs = append(rs, specs.LinuxSyscall{Names: []string{"socket"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{fam, typ(t), eq(2, p)}})
			for _, a := range maskedRange(2, lo, p, ^uint64(0)) {
				rs = append(rs, errnoRule("socket", unix.EPROTONOSUPPORT, fam, typ(t), a))
			}
			lo = p + 1
		}
		rs = append(rs, errnoRule("socket", unix.EPROTONOSUPPORT, fam, typ(t), gt(2, lo-1)))
	}
	protocols(unix.SOCK_STREAM, 0, unix.IPPROTO_TCP)
	dgram := []uint64{0, unix.IPPROTO_UDP, ping}
	slices.Sort(dgram)
	protocols(unix.SOCK_DGRAM, dgram...)
	rs = append(rs, errnoRule("socket", unix.EPERM, fam, typ(unix.SOCK_RAW)))
	// Every other type: 0, and SOCK_RDM (4) up to the mask's last value.
	other := maskedRange(1, 0, unix.SOCK_STREAM, sockTypeMask)
	other = append(other, maskedRange(1, unix.SOCK_RAW+1, sockTypeMask+1, sockTypeMask)...)
	for _, a := range other {
		rs = append(rs, errnoRule("socket", unix.ESOCKTNOSUPPORT, fam, a))
	}
	return rs
}

func socketpairRules() []specs.LinuxSyscall {
	return []specs.LinuxSyscall{
		{Names: []string{"socketpair"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{eq(0, unix.AF_UNIX)}},
		errnoRule("socketpair", unix.EAFNOSUPPORT, lt(0, unix.AF_UNIX)),
		errnoRule("socketpair", unix.EAFNOSUPPORT, gt(0, unix.AF_UNIX)),
	}
}

func ioctlRules() []specs.LinuxSyscall {
	var rs []specs.LinuxSyscall
	// The commands between the refused ones (sorted), whatever the
	// upper 32 bits.
	lo := uint64(0)
	for _, cmd := range refusedIoctls {
		for _, a := range maskedRange(1, lo, cmd, low32) {
			rs = append(rs, specs.LinuxSyscall{Names: []string{"ioctl"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{a}})
		}
		rs = append(rs, errnoRule("ioctl", unix.EPERM, masked(1, low32, cmd)))
		lo = cmd + 1
	}
	for _, a := range maskedRange(1, lo, 1<<32, low32) {
		rs = append(rs, specs.LinuxSyscall{Names: []string{"ioctl"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{a}})
	}
	return rs
}

// setsockoptRules allow every level but SOL_TCP, and every option of
// SOL_TCP but TCP_ULP, for a level and an option without upper bits (as
// libc and Go pass a non-negative int); a level or option with upper bits
// meets the default action, since the kernel would read only its lower
// 32 bits.
func setsockoptRules() []specs.LinuxSyscall {
	allow := func(args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"setsockopt"}, Action: specs.ActAllow, Args: args}
	}
	const level, opt = 1, 2
	rs := []specs.LinuxSyscall{
		allow(lt(level, unix.SOL_TCP)),
		allow(eq(level, unix.SOL_TCP), lt(opt, tcpULP)),
		errnoRule("setsockopt", unix.EPERM, masked(level, low32, unix.SOL_TCP), masked(opt, low32, tcpULP)),
	}
	for _, a := range maskedRange(level, unix.SOL_TCP+1, 1<<32, ^uint64(0)) {
		rs = append(rs, allow(a))
	}
	for _, a := range maskedRange(opt, tcpULP+1, 1<<32, ^uint64(0)) {
		rs = append(rs, allow(eq(level, unix.SOL_TCP), a))
	}
	return rs
}

// maskedRange is [lo, hi) of argument index as masked comparisons, one per
// aligned block: value v matches a block of size 2^k at b when
// v & keep &^ (2^k-1) == b. keep is the bits compared: ^0 for the whole
// argument (a value with upper bits is then outside any block), low32 for
// the 32 bits the kernel reads. hi is at most 2^32.
func maskedRange(index uint, lo, hi, keep uint64) []specs.LinuxSeccompArg {
	var out []specs.LinuxSeccompArg
	for lo < hi {
		k := 32
		if lo != 0 {
			k = bits.TrailingZeros64(lo)
		}
		for lo+1<<k > hi {
			k--
		}
		out = append(out, masked(index, keep&^(1<<k-1), lo))
		lo += 1 << k
	}
	return out
}

func eq(index uint, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: index, Value: v, Op: specs.OpEqualTo}
}

func lt(index uint, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: index, Value: v, Op: specs.OpLessThan}
}

func gt(index uint, v uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: index, Value: v, Op: specs.OpGreaterThan}
}

// masked matches an argument v with v & mask == value.
func masked(index uint, mask, value uint64) specs.LinuxSeccompArg {
	return specs.LinuxSeccompArg{Index: index, Value: mask, ValueTwo: value, Op: specs.OpMaskedEqual}
}

func errnoRule(name string, errno unix.Errno, args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
	e := uint(errno)
	return specs.LinuxSyscall{Names: []string{name}, Action: specs.ActErrno, ErrnoRet: &e, Args: args}
}
