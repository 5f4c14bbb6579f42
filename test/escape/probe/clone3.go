//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// clone3 reads its flags from a struct in memory, where no seccomp filter
// can see them: the filter must refuse the call whole, with ENOSYS, so
// that glibc falls back to clone, whose flags it reads. Each probe runs
// the helper "-rawclone clone3 FLAGS" as a child of its own; the helper
// makes the call raw and, if a child is made, that child (running nothing
// but raw system calls) prints its effective capabilities and whether it
// opened a raw socket: the breach's evidence (under gVisor, allowed,
// clone3 with CLONE_NEWUSER gave a child every capability in its new
// namespace). The control runs the same helper with clone and no
// namespace flag: its child reports.

const (
	nrWrite     = 1
	nrClose     = 3
	nrClone     = 56
	nrExitGroup = 231
)

// cloneArgs is struct clone_args of include/uapi/linux/sched.h, its first
// version (CLONE_ARGS_SIZE_VER0, 64 bytes): flags, pidfd, child_tid,
// parent_tid, exit_signal, stack, stack_size, tls; the probes set flags
// and exit_signal alone.
type cloneArgs [8]uint64

// The fields of cloneArgs the probes set.
const (
	cloneFlags      = 0
	cloneExitSignal = 4
)

// clone3Probes: clone3 with each namespace flag, and with CLONE_NEWUSER
// and CLONE_NEWNET together, fails.
func clone3Probes() []probeDef {
	ps := []probeDef{clone3Probe("clone3-newuser-newnet", "CLONE_NEWUSER|CLONE_NEWNET", unix.CLONE_NEWUSER|unix.CLONE_NEWNET)}
	for _, c := range []struct {
		id    string
		flags uint64
	}{{"user", unix.CLONE_NEWUSER}, {"mnt", unix.CLONE_NEWNS}, {"pid", unix.CLONE_NEWPID}, {"net", unix.CLONE_NEWNET},
		{"ipc", unix.CLONE_NEWIPC}, {"uts", unix.CLONE_NEWUTS}, {"cgroup", unix.CLONE_NEWCGROUP}, {"time", unix.CLONE_NEWTIME}} {
		ps = append(ps, clone3Probe("clone3-new"+c.id, "CLONE_NEW"+strings.ToUpper(c.id), c.flags))
	}
	return ps
}

func clone3Probe(id, flagNames string, flags uint64) probeDef {
	return probeDef{id, "clone3(" + flagNames + ") of a child reporting its capabilities and a raw socket", "namespaces", 18, func(p *Probe) {
		p.ControlOK, p.Control = ctlRawClone()
		ws, out, err := runChild([]string{selfExe, "-rawclone", "clone3", strconv.FormatUint(flags, 10)}, nil, nil)
		if err != nil {
			p.NotProbed = "starting the helper: " + err.Error()
			return
		}
		if e, ok := strings.CutPrefix(out, "errno "); ok {
			p.Blocked, p.Errno = true, strings.TrimSpace(e)
			p.Detail = fmt.Sprintf("clone3(%#x): %s", flags, p.Errno)
			return
		}
		p.Detail = fmt.Sprintf("clone3(%#x): the helper (%s) said %q", flags, describeWait(ws), out)
	}}
}

// ctlRawClone runs the helper with clone(SIGCHLD): its child must report
// no capability, and the helper its exit.
func ctlRawClone() (bool, string) {
	ws, out, err := runChild([]string{selfExe, "-rawclone", "clone", "0"}, nil, nil)
	ok := err == nil && ws.Exited() && ws.ExitStatus() == 0 &&
		out == "CapEff 0000000000000000, raw socket refused\nchild exit 0\n"
	return ok, fmt.Sprintf("the same helper with clone(SIGCHLD) (%s, %v): %q", describeWait(ws), err, out)
}

// rawCloneChild is the helper: args are the call ("clone" or "clone3") and
// its namespace flags. It prints "errno NAME" when the call fails, else
// what its child prints and "child exit N" once the child has ended.
func rawCloneChild(args []string) {
	if len(args) != 2 {
		os.Exit(2)
	}
	flags, err := strconv.ParseUint(args[1], 10, 64)
	if err != nil {
		os.Exit(2)
	}
	runtime.LockOSThread()
	r := newChildReport()
	var pid uintptr
	var e syscall.Errno
	switch args[0] {
	case "clone3":
		ca := &cloneArgs{cloneFlags: flags, cloneExitSignal: uint64(unix.SIGCHLD)}
		pid, e = forkReport(nrClone3, pin(ca), unsafe.Sizeof(*ca), r)
	case "clone":
		pid, e = forkReport(nrClone, uintptr(flags)|uintptr(unix.SIGCHLD), 0, r)
	default:
		os.Exit(2)
	}
	runtime.KeepAlive(r)
	if e != 0 {
		fmt.Printf("errno %s\n", ename(e))
		os.Exit(0)
	}
	var ws syscall.WaitStatus
	for {
		if _, werr := syscall.Wait4(int(pid), &ws, 0, nil); werr != syscall.EINTR {
			break
		}
	}
	fmt.Printf("child %s\n", describeWait(ws))
}

// childReport is all the child of forkReport touches, made before the
// call: it writes "CapEff <16 hex digits>, raw socket ok|refused\n".
type childReport struct {
	hdr  unix.CapUserHeader
	data [2]unix.CapUserData
	// line is written whole: byte arrays, so no padding between them.
	line struct {
		label [len("CapEff ")]byte
		eff   [16]byte
		sock  [len(", raw socket ")]byte
	}
	ok, refused [len("refused\n")]byte
	hex         [16]byte
}

func newChildReport() *childReport {
	r := &childReport{hdr: unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}}
	copy(r.line.label[:], "CapEff ")
	copy(r.line.sock[:], ", raw socket ")
	copy(r.ok[:], "ok\n")
	copy(r.refused[:], "refused\n")
	copy(r.hex[:], "0123456789abcdef")
	return r
}

// forkReport makes system call nr (clone or clone3, without CLONE_VM: the
// child has a copy of this memory and this thread alone); the child runs
// nothing but this function's own instructions and raw system calls: it
// reads its capabilities, tries a raw socket, writes r's line on stdout
// and exits.
//
//go:nosplit
//go:norace
func forkReport(nr, a1, a2 uintptr, r *childReport) (uintptr, syscall.Errno) {
	pid, _, e := syscall.RawSyscall(nr, a1, a2, 0)
	if e != 0 || pid != 0 {
		return pid, e
	}
	syscall.RawSyscall(nrCapget, uintptr(unsafe.Pointer(&r.hdr)), uintptr(unsafe.Pointer(&r.data)), 0)
	eff := uint64(r.data[1].Effective)<<32 | uint64(r.data[0].Effective)
	for i := uint(0); i < 16; i++ {
		r.line.eff[(15-i)&15] = r.hex[eff>>(4*i)&15]
	}
	end, n := unsafe.Pointer(&r.refused), uintptr(len("refused\n"))
	if fd, _, e := syscall.RawSyscall(nrSocket, unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP); e == 0 {
		syscall.RawSyscall(nrClose, fd, 0, 0)
		end, n = unsafe.Pointer(&r.ok), uintptr(len("ok\n"))
	}
	syscall.RawSyscall(nrWrite, 1, uintptr(unsafe.Pointer(&r.line)), unsafe.Sizeof(r.line))
	syscall.RawSyscall(nrWrite, 1, uintptr(end), n)
	syscall.RawSyscall(nrExitGroup, 0, 0, 0)
	return 0, 0
}
