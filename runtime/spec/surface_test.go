package spec

import (
	"math/rand/v2"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// verdict is what the filter answers a call: allowed, or the errno.
type verdict struct {
	allow bool
	errno uint
}

var allowed = verdict{allow: true}

func refused(e unix.Errno) verdict { return verdict{errno: uint(e)} }

// evaluate answers syscall name with args as the composed filter does,
// and fails t unless at most one rule matches (libseccomp gives
// overlapping rules no defined order).
func evaluate(t *testing.T, f *specs.LinuxSeccomp, name string, args ...uint64) verdict {
	t.Helper()
	var a [6]uint64
	copy(a[:], args)
	var got []verdict
	for _, r := range f.Syscalls {
		if !slices.Contains(r.Names, name) || !matches(t, r.Args, a) {
			continue
		}
		v := verdict{allow: r.Action == specs.ActAllow}
		if r.Action == specs.ActErrno {
			v.errno = uint(unix.EPERM)
			if r.ErrnoRet != nil {
				v.errno = *r.ErrnoRet
			}
		} else if !v.allow {
			t.Fatalf("%s: unexpected action %s", name, r.Action)
		}
		got = append(got, v)
	}
	switch len(got) {
	case 0:
		// The default action.
		return verdict{errno: *f.DefaultErrnoRet}
	case 1:
		return got[0]
	}
	t.Errorf("%s%#x: %d rules match; want at most one", name, args, len(got))
	return got[0]
}

// matches reports whether every comparison of a rule holds (libcontainer
// ORs comparisons of one argument: no rule here may have two).
func matches(t *testing.T, cmp []specs.LinuxSeccompArg, a [6]uint64) bool {
	t.Helper()
	seen := map[uint]bool{}
	for _, c := range cmp {
		if seen[c.Index] {
			t.Fatalf("a rule compares argument %d twice", c.Index)
		}
		seen[c.Index] = true
		v := a[c.Index]
		var ok bool
		switch c.Op {
		case specs.OpEqualTo:
			ok = v == c.Value
		case specs.OpLessThan:
			ok = v < c.Value
		case specs.OpGreaterThan:
			ok = v > c.Value
		case specs.OpMaskedEqual:
			ok = v&c.Value == c.ValueTwo
		default:
			t.Fatalf("unexpected operator %s", c.Op)
		}
		if !ok {
			return false
		}
	}
	return true
}

func TestSurfaceSocket(t *testing.T) {
	f := valid(t).Linux.Seccomp
	const hi = 1 << 32
	for _, tc := range []struct {
		family, proto uint64
		want          verdict
	}{
		{unix.AF_UNIX, 0, allowed},
		{unix.AF_INET, 0, allowed},
		{unix.AF_INET, unix.IPPROTO_TCP, allowed},
		{unix.AF_INET6, unix.IPPROTO_TCP, allowed},
		{unix.AF_NETLINK, unix.NETLINK_ROUTE, allowed},
		{unix.AF_NETLINK, unix.NETLINK_XFRM, refused(unix.EPROTONOSUPPORT)},
		{unix.AF_NETLINK, unix.NETLINK_NETFILTER, refused(unix.EPROTONOSUPPORT)},
		{unix.AF_NETLINK, unix.NETLINK_AUDIT, refused(unix.EPROTONOSUPPORT)},
		{unix.AF_NETLINK, unix.NETLINK_GENERIC, refused(unix.EPROTONOSUPPORT)},
		{unix.AF_NETLINK, unix.NETLINK_KOBJECT_UEVENT, refused(unix.EPROTONOSUPPORT)},
		{unix.AF_NETLINK, hi, refused(unix.EPROTONOSUPPORT)},
		{unix.AF_UNSPEC, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_AX25, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_BRIDGE, 0, refused(unix.EAFNOSUPPORT)},
		{9, 0, refused(unix.EAFNOSUPPORT)},
		{11, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_KEY, 2, refused(unix.EAFNOSUPPORT)},
		{unix.AF_PACKET, 0x300, refused(unix.EAFNOSUPPORT)},
		{unix.AF_RXRPC, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_CAN, 1, refused(unix.EAFNOSUPPORT)},
		{unix.AF_TIPC, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_ALG, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_VSOCK, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_KCM, 0, refused(unix.EAFNOSUPPORT)},
		{unix.AF_MAX, 0, refused(unix.EAFNOSUPPORT)},
		{200, 0, refused(unix.EAFNOSUPPORT)},
		{hi | unix.AF_UNIX, 0, refused(unix.EAFNOSUPPORT)},
		{^uint64(0), 0, refused(unix.EAFNOSUPPORT)},
	} {
		if got := evaluate(t, f, "socket", tc.family, unix.SOCK_STREAM, tc.proto); got != tc.want {
			t.Errorf("socket(%#x, SOCK_STREAM, %#x) = %+v; want %+v", tc.family, tc.proto, got, tc.want)
		}
	}
	for _, tc := range []struct {
		family uint64
		want   verdict
	}{
		{unix.AF_UNIX, allowed},
		{unix.AF_UNSPEC, refused(unix.EAFNOSUPPORT)},
		{unix.AF_INET, refused(unix.EAFNOSUPPORT)},
		{unix.AF_NETLINK, refused(unix.EAFNOSUPPORT)},
		{hi | unix.AF_UNIX, refused(unix.EAFNOSUPPORT)},
	} {
		if got := evaluate(t, f, "socketpair", tc.family, unix.SOCK_STREAM, 0); got != tc.want {
			t.Errorf("socketpair(%#x) = %+v; want %+v", tc.family, got, tc.want)
		}
	}
}

// AF_INET and AF_INET6 are TCP, UDP and ping alone: MPTCP, UDP-Lite,
// SCTP, DCCP and raw sockets are refused as a kernel without them (or,
// for raw ones, without CAP_NET_RAW) refuses them.
func TestSurfaceInetSocket(t *testing.T) {
	f := valid(t).Linux.Seccomp
	const (
		hi        = 1 << 32
		flags     = unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC
		mptcp     = unix.IPPROTO_MPTCP
		udplite   = unix.IPPROTO_UDPLITE
		sctp      = unix.IPPROTO_SCTP
		ethPAll   = 0x300
		protoNone = unix.EPROTONOSUPPORT
		typeNone  = unix.ESOCKTNOSUPPORT
	)
	for _, fam := range []uint64{unix.AF_INET, unix.AF_INET6} {
		ping, otherPing := uint64(unix.IPPROTO_ICMP), uint64(unix.IPPROTO_ICMPV6)
		if fam == unix.AF_INET6 {
			ping, otherPing = otherPing, ping
		}
		for _, tc := range []struct {
			typ, proto uint64
			want       verdict
		}{
			{unix.SOCK_STREAM, 0, allowed},
			{unix.SOCK_STREAM, unix.IPPROTO_TCP, allowed},
			{unix.SOCK_STREAM | flags, 0, allowed},
			{unix.SOCK_STREAM | unix.SOCK_NONBLOCK, unix.IPPROTO_TCP, allowed},
			{hi | unix.SOCK_STREAM, 0, allowed},
			{unix.SOCK_DGRAM, 0, allowed},
			{unix.SOCK_DGRAM, unix.IPPROTO_UDP, allowed},
			{unix.SOCK_DGRAM | flags, unix.IPPROTO_UDP, allowed},
			{unix.SOCK_DGRAM, ping, allowed},
			{unix.SOCK_DGRAM | unix.SOCK_CLOEXEC, ping, allowed},
			{unix.SOCK_DGRAM, otherPing, refused(protoNone)},
			{unix.SOCK_STREAM, mptcp, refused(protoNone)},
			{unix.SOCK_STREAM | flags, mptcp, refused(protoNone)},
			{unix.SOCK_STREAM, hi | mptcp, refused(protoNone)},
			{unix.SOCK_STREAM, hi | unix.IPPROTO_TCP, refused(protoNone)},
			{unix.SOCK_STREAM, hi, refused(protoNone)},
			{unix.SOCK_STREAM, sctp, refused(protoNone)},
			{unix.SOCK_STREAM, unix.IPPROTO_UDP, refused(protoNone)},
			{unix.SOCK_STREAM, unix.IPPROTO_TCP + 1, refused(protoNone)},
			{unix.SOCK_STREAM, 1, refused(protoNone)},
			{unix.SOCK_STREAM, ^uint64(0), refused(protoNone)},
			{unix.SOCK_DGRAM, udplite, refused(protoNone)},
			{unix.SOCK_DGRAM | flags, udplite, refused(protoNone)},
			{unix.SOCK_DGRAM, unix.IPPROTO_TCP, refused(protoNone)},
			{unix.SOCK_DGRAM, hi | unix.IPPROTO_UDP, refused(protoNone)},
			{unix.SOCK_DGRAM, ^uint64(0), refused(protoNone)},
			{unix.SOCK_RAW, unix.IPPROTO_RAW, refused(unix.EPERM)},
			{unix.SOCK_RAW, 0, refused(unix.EPERM)},
			{unix.SOCK_RAW | flags, ping, refused(unix.EPERM)},
			{unix.SOCK_SEQPACKET, sctp, refused(typeNone)},
			{unix.SOCK_SEQPACKET, 0, refused(typeNone)},
			{unix.SOCK_DCCP, unix.IPPROTO_DCCP, refused(typeNone)},
			{unix.SOCK_DCCP | flags, 0, refused(typeNone)},
			{unix.SOCK_RDM, 0, refused(typeNone)},
			{unix.SOCK_PACKET, ethPAll, refused(typeNone)},
			{0, 0, refused(typeNone)},
			{sockTypeMask, 0, refused(typeNone)},
		} {
			if got := evaluate(t, f, "socket", fam, tc.typ, tc.proto); got != tc.want {
				t.Errorf("socket(%d, %#x, %#x) = %+v; want %+v", fam, tc.typ, tc.proto, got, tc.want)
			}
		}
	}
	// Whatever the arguments, one rule answers (evaluate checks), and
	// only TCP, UDP and ping pass.
	r := rand.New(rand.NewPCG(5, 6))
	pick := func(vs ...uint64) uint64 { return vs[r.IntN(len(vs))] }
	for range 20000 {
		fam := pick(unix.AF_INET, unix.AF_INET6)
		typ := r.Uint64N(16) | pick(0, unix.SOCK_NONBLOCK, unix.SOCK_CLOEXEC, r.Uint64()&^sockTypeMask)
		proto := pick(0, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6, r.Uint64N(300), r.Uint64())
		if r.IntN(8) == 0 {
			proto |= r.Uint64() << 32
		}
		ping := uint64(unix.IPPROTO_ICMP)
		if fam == unix.AF_INET6 {
			ping = unix.IPPROTO_ICMPV6
		}
		var want bool
		switch typ & sockTypeMask {
		case unix.SOCK_STREAM:
			want = proto == 0 || proto == unix.IPPROTO_TCP
		case unix.SOCK_DGRAM:
			want = proto == 0 || proto == unix.IPPROTO_UDP || proto == ping
		}
		if got := evaluate(t, f, "socket", fam, typ, proto); got.allow != want {
			t.Fatalf("socket(%d, %#x, %#x) = %+v; want allowed %v", fam, typ, proto, got, want)
		}
	}
}

func TestSurfaceIoctl(t *testing.T) {
	f := valid(t).Linux.Seccomp
	for _, cmd := range []uint64{unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD} {
		for _, upper := range []uint64{0, 1 << 32, 0xffff_ffff << 32} {
			if got := evaluate(t, f, "ioctl", 0, upper|cmd); got != refused(unix.EPERM) {
				t.Errorf("ioctl(%#x) = %+v; want EPERM", upper|cmd, got)
			}
		}
	}
	for _, cmd := range []uint64{0, unix.TCGETS, unix.TIOCGWINSZ, 0x5421 /* FIONBIO */, unix.TIOCSTI - 1, unix.TIOCSTI + 1, unix.TIOCSETD + 1, unix.TIOCGPTN, 0xffff_ffff_8004_5430, 0xffff_ffff, ^uint64(0)} {
		if got := evaluate(t, f, "ioctl", 0, cmd); got != allowed {
			t.Errorf("ioctl(%#x) = %+v; want allowed", cmd, got)
		}
	}
	// Any other command, whatever its upper bits, is allowed.
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		cmd := r.Uint64()
		if slices.Contains(refusedIoctls, cmd&low32) {
			continue
		}
		if got := evaluate(t, f, "ioctl", 0, cmd); got != allowed {
			t.Fatalf("ioctl(%#x) = %+v; want allowed", cmd, got)
		}
	}
}

func TestSurfaceSetsockopt(t *testing.T) {
	f := valid(t).Linux.Seccomp
	for _, tc := range []struct {
		level, opt uint64
		want       verdict
	}{
		{unix.SOL_TCP, tcpULP, refused(unix.EPERM)},
		{1<<32 | unix.SOL_TCP, tcpULP, refused(unix.EPERM)},
		{unix.SOL_TCP, 1<<32 | tcpULP, refused(unix.EPERM)},
		{0xffff_ffff<<32 | unix.SOL_TCP, 0xffff_ffff<<32 | tcpULP, refused(unix.EPERM)},
		{unix.SOL_TCP, unix.TCP_NODELAY, allowed},
		{unix.SOL_TCP, unix.TCP_CONGESTION, allowed},
		{unix.SOL_TCP, tcpULP + 1, allowed},
		{unix.SOL_TCP, 0xffff_ffff, allowed},
		{unix.SOL_SOCKET, unix.SO_REUSEADDR, allowed},
		{unix.SOL_SOCKET, tcpULP, allowed},
		{unix.IPPROTO_IP, unix.IP_TOS, allowed},
		{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, allowed},
		{unix.SOL_TLS, 1, allowed},
		{0xffff_ffff, tcpULP, allowed},
	} {
		if got := evaluate(t, f, "setsockopt", 0, tc.level, tc.opt); got != tc.want {
			t.Errorf("setsockopt(%#x, %#x) = %+v; want %+v", tc.level, tc.opt, got, tc.want)
		}
	}
	// Never TCP_ULP, whatever the upper bits; everything else without
	// upper bits is allowed.
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		level, opt := r.Uint64N(64), r.Uint64N(64)
		if r.IntN(2) == 0 {
			level |= r.Uint64() << 32
		}
		if r.IntN(2) == 0 {
			opt |= r.Uint64() << 32
		}
		if r.IntN(4) == 0 {
			level = unix.SOL_TCP | level&^low32
		}
		if r.IntN(4) == 0 {
			opt = tcpULP | opt&^low32
		}
		got := evaluate(t, f, "setsockopt", 0, level, opt)
		ulp := level&low32 == unix.SOL_TCP && opt&low32 == tcpULP
		plain := level <= low32 && opt <= low32
		if (ulp && got.allow) || (plain && !ulp && !got.allow) {
			t.Fatalf("setsockopt(%#x, %#x) = %+v", level, opt, got)
		}
	}
}

func TestSurfaceNoUnconditionalRule(t *testing.T) {
	f := valid(t).Linux.Seccomp
	for _, r := range f.Syscalls {
		for _, n := range r.Names {
			if slices.Contains(surfaceSyscalls, n) && len(r.Args) == 0 {
				t.Errorf("unconditional %s rule for %s", r.Action, n)
			}
		}
	}
	cp := *f
	cp.Syscalls = append(slices.Clone(f.Syscalls), specs.LinuxSyscall{Names: []string{"ioctl"}, Action: specs.ActAllow})
	if err := checkSeccomp(&cp); err == nil {
		t.Error("checkSeccomp accepts an unconditional ioctl rule")
	}
}

func TestMaskedRange(t *testing.T) {
	for _, tc := range []struct{ lo, hi uint64 }{{0, 1}, {3, 10}, {11, 16}, {7, 1 << 32}, {0x5413, 0x541c}, {0, 1 << 32}} {
		got := maskedRange(0, tc.lo, tc.hi, ^uint64(0))
		in := func(v uint64) bool {
			return slices.ContainsFunc(got, func(c specs.LinuxSeccompArg) bool { return v&c.Value == c.ValueTwo })
		}
		for _, v := range []uint64{tc.lo, tc.hi - 1, (tc.lo + tc.hi) / 2} {
			if !in(v) {
				t.Errorf("maskedRange(%#x, %#x) misses %#x", tc.lo, tc.hi, v)
			}
		}
		for _, v := range []uint64{tc.lo - 1, tc.hi, 1<<32 | tc.lo} {
			if in(v) {
				t.Errorf("maskedRange(%#x, %#x) holds %#x", tc.lo, tc.hi, v)
			}
		}
	}
}
