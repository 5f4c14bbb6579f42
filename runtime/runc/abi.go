package runc

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// x32Bit marks a system call made through the x32 ABI.
const x32Bit = 0x40000000

// nativeABIFilter kills the whole process on a system call through any
// ABI but native x86-64: an i386 (int 0x80) or x32 call. The sandbox's
// main filter (Docker's profile, native ABI only) answers those with its
// bad-arch action, which libcontainer makes "kill the calling thread": a
// program whose thread died that way hung until its timeout. Filters
// stack, and the kernel takes the strictest answer, so this one turns
// that answer into the end of the process (SIGSYS), reported at once.
var nativeABIFilter = []unix.SockFilter{
	{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},                                     // arch
	{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.AUDIT_ARCH_X86_64, Jt: 0, Jf: 3}, // not x86-64: kill
	{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},                                     // nr
	{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: x32Bit, Jt: 1, Jf: 0},                // x32: kill
	{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_KILL_PROCESS},
}

// installNativeABIFilter installs nativeABIFilter on every thread of the
// container's init (still root with all capabilities), before
// libcontainer sets the container up: the program inherits it across exec.
func installNativeABIFilter() error {
	prog := unix.SockFprog{Len: uint16(len(nativeABIFilter)), Filter: &nativeABIFilter[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("installing the native-ABI seccomp filter: %w", e)
	}
	return nil
}
