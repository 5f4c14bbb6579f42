//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const mntDir = "/tmp/agentrun-probe-mnt"

// atCwd is AT_FDCWD (-100) as a syscall argument.
var atCwd = ^uintptr(99)

func ensureMntDir() { os.MkdirAll(mntDir, 0o755) }

func umountUndo(target string) func(uintptr) {
	return func(uintptr) { raw(nrUmount2, cstr(target), unix.MNT_DETACH) }
}

func syscallProbes() []probeDef {
	ensureMntDir()
	neg1 := ^uintptr(0) // -1 as an argument
	ps := []probeDef{
		// Item 19: mounts and namespaces.
		sysProbe(sysSpec{id: "mount-tmpfs", name: "mount tmpfs on a /tmp directory", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMount, cstr("tmpfs"), cstr(mntDir), cstr("tmpfs"), 0, cstr("size=1m"))
			}, undo: umountUndo(mntDir)}),
		sysProbe(sysSpec{id: "mount-proc", name: "mount a new proc", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMount, cstr("proc"), cstr(mntDir), cstr("proc"), 0, 0)
			}, undo: umountUndo(mntDir)}),
		sysProbe(sysSpec{id: "mount-cgroup", name: "mount cgroup (v1 rdma/memory, release_agent: CVE-2022-0492)", cat: "mount", item: 12,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMount, cstr("cgroup"), cstr(mntDir), cstr("cgroup"), 0, cstr("memory"))
			}, undo: umountUndo(mntDir)}),
		sysProbe(sysSpec{id: "mount-cgroup2", name: "mount cgroup2", cat: "mount", item: 12,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMount, cstr("cgroup2"), cstr(mntDir), cstr("cgroup2"), 0, 0)
			}, undo: umountUndo(mntDir)}),
		sysProbe(sysSpec{id: "mount-bind-root", name: "bind-mount / elsewhere", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMount, cstr("/"), cstr(mntDir), 0, unix.MS_BIND|unix.MS_REC, 0)
			}, undo: umountUndo(mntDir)}),
		sysProbe(sysSpec{id: "mount-remount-root-rw", name: "remount / read-write", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMount, 0, cstr("/"), 0, unix.MS_REMOUNT|unix.MS_BIND, 0)
			}}),
		{"umount2-masked", "umount2 a masked /proc file to unmask it", "mount", 19, func(p *Probe) {
			// The control finds a masked path that is a mount point here
			// (which ones exist depends on the kernel).
			ms, _ := mountinfo()
			target := ""
			for _, f := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/interrupts", "/proc/acpi", "/sys/firmware"} {
				if _, ok := lastMount(ms, f); ok {
					target = f
					break
				}
			}
			p.ControlOK = target != ""
			p.Control = fmt.Sprintf("masked mount point found in mountinfo: %q", target)
			if target == "" {
				p.NotProbed = "no masked path is a mount point"
				return
			}
			_, e := raw(nrUmount2, cstr(target), unix.MNT_DETACH)
			p.Errno = ename(e)
			if e == 0 {
				p.Detail = "unmounted the mask over " + target
				return
			}
			p.Blocked, p.Detail = true, fmt.Sprintf("umount2(%s): %s (%v)", target, ename(e), e)
		}},
		sysProbe(sysSpec{id: "umount2-proc-sys", name: "umount2(/proc/sys) to make it writable", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) { return raw(nrUmount2, cstr("/proc/sys"), unix.MNT_DETACH) },
			control: func() (bool, string) {
				ms, _ := mountinfo()
				_, ok := lastMount(ms, "/proc/sys")
				return ok, fmt.Sprintf("/proc/sys is a mount point in mountinfo: %v", ok)
			}}),
		sysProbe(sysSpec{id: "pivot-root", name: "pivot_root(/tmp, /tmp/agentrun-probe-mnt)", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) { return raw(nrPivotRoot, cstr("/tmp"), cstr(mntDir)) }}),
		sysProbe(sysSpec{id: "fsopen", name: `fsopen("tmpfs")`, cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) { return raw(nrFsopen, cstr("tmpfs"), unix.FSOPEN_CLOEXEC) }, undo: closeFd}),
		sysProbe(sysSpec{id: "fsconfig", name: "fsconfig(-1, ...)", cat: "mount", item: 19,
			call:    func() (uintptr, unix.Errno) { return raw(nrFsconfig, neg1, unix.FSCONFIG_CMD_CREATE, 0, 0, 0) },
			reached: []unix.Errno{unix.EBADF}}),
		sysProbe(sysSpec{id: "fsmount", name: "fsmount(-1, ...)", cat: "mount", item: 19,
			call:    func() (uintptr, unix.Errno) { return raw(nrFsmount, neg1, 0, 0) },
			reached: []unix.Errno{unix.EBADF}}),
		sysProbe(sysSpec{id: "fspick", name: `fspick(AT_FDCWD, "/")`, cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) { return raw(nrFspick, atCwd, cstr("/"), unix.FSPICK_CLOEXEC) }, undo: closeFd}),
		sysProbe(sysSpec{id: "open-tree-clone", name: `open_tree(AT_FDCWD, "/", OPEN_TREE_CLONE)`, cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				return raw(nrOpenTree, atCwd, cstr("/"), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
			}, undo: closeFd}),
		sysProbe(sysSpec{id: "move-mount", name: "move_mount(-1, ...)", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				return raw(nrMoveMount, neg1, cstr(""), atCwd, cstr(mntDir), unix.MOVE_MOUNT_F_EMPTY_PATH)
			},
			reached: []unix.Errno{unix.EBADF}}),
		sysProbe(sysSpec{id: "mount-setattr-root-rw", name: "mount_setattr(/, clear MOUNT_ATTR_RDONLY)", cat: "mount", item: 19,
			call: func() (uintptr, unix.Errno) {
				a := &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}
				return raw(nrMountSetattr, atCwd, cstr("/"), 0, pin(a), unsafe.Sizeof(*a))
			}}),
		sysProbe(sysSpec{id: "setns-net", name: "setns(/proc/self/ns/net)", cat: "namespaces", item: 19,
			call: func() (uintptr, unix.Errno) {
				fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					return 0, errnoOf(err)
				}
				defer unix.Close(fd)
				return raw(nrSetns, uintptr(fd), unix.CLONE_NEWNET)
			},
			control: func() (bool, string) {
				fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err == nil {
					unix.Close(fd)
				}
				return err == nil, fmt.Sprintf("open /proc/self/ns/net: %v", err)
			}}),
		sysProbe(sysSpec{id: "setns-mnt", name: "setns(/proc/self/ns/mnt)", cat: "namespaces", item: 19,
			call: func() (uintptr, unix.Errno) {
				fd, err := unix.Open("/proc/self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					return 0, errnoOf(err)
				}
				defer unix.Close(fd)
				return raw(nrSetns, uintptr(fd), unix.CLONE_NEWNS)
			}}),

		// Item 20: keyrings.
		sysProbe(sysSpec{id: "keyctl", name: "keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING)", cat: "syscalls", item: 20,
			call: func() (uintptr, unix.Errno) {
				return raw(nrKeyctl, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffc), 0) // -4
			}}),
		sysProbe(sysSpec{id: "add-key", name: `add_key("user", ...) to the process keyring`, cat: "syscalls", item: 20,
			call: func() (uintptr, unix.Errno) {
				return raw(nrAddKey, cstr("user"), cstr("agentrun-probe"), cstr("x"), 1, uintptr(0xfffffffe)) // -2
			}}),
		sysProbe(sysSpec{id: "request-key", name: `request_key("user", "agentrun-probe-none")`, cat: "syscalls", item: 20,
			call: func() (uintptr, unix.Errno) {
				return raw(nrRequestKey, cstr("user"), cstr("agentrun-probe-none"), 0, 0)
			},
			reached: []unix.Errno{unix.ENOKEY}}),

		// Item 21.
		sysProbe(sysSpec{id: "userfaultfd", name: "userfaultfd(UFFD_USER_MODE_ONLY)", cat: "syscalls", item: 21,
			call: func() (uintptr, unix.Errno) { return raw(nrUserfaultfd, 1|unix.O_CLOEXEC) }, undo: closeFd}),
		sysProbe(sysSpec{id: "io-uring-setup", name: "io_uring_setup(4, &params)", cat: "syscalls", item: 21,
			call: func() (uintptr, unix.Errno) {
				params := new([120]byte)
				return raw(nrIOUringSetup, 4, pin(params))
			}, undo: closeFd}),
		sysProbe(sysSpec{id: "io-uring-enter", name: "io_uring_enter(-1, ...)", cat: "syscalls", item: 21,
			call:    func() (uintptr, unix.Errno) { return raw(nrIOUringEnter, neg1, 0, 0, 0, 0, 0) },
			reached: []unix.Errno{unix.EBADF}}),
		sysProbe(sysSpec{id: "io-uring-register", name: "io_uring_register(-1, ...)", cat: "syscalls", item: 21,
			call:    func() (uintptr, unix.Errno) { return raw(nrIOUringRegister, neg1, 0, 0, 0) },
			reached: []unix.Errno{unix.EBADF}}),
		sysProbe(sysSpec{id: "bpf-map-create", name: "bpf(BPF_MAP_CREATE, array map)", cat: "syscalls", item: 21,
			call: func() (uintptr, unix.Errno) {
				attr := new([128]byte)
				*(*uint32)(unsafe.Pointer(&attr[0])) = 2  // BPF_MAP_TYPE_ARRAY
				*(*uint32)(unsafe.Pointer(&attr[4])) = 4  // key_size
				*(*uint32)(unsafe.Pointer(&attr[8])) = 4  // value_size
				*(*uint32)(unsafe.Pointer(&attr[12])) = 1 // max_entries
				return raw(nrBPF, 0, pin(attr), 128)
			}, undo: closeFd}),
		sysProbe(sysSpec{id: "perf-event-open", name: "perf_event_open(software cpu-clock, self, user only)", cat: "syscalls", item: 21,
			call: func() (uintptr, unix.Errno) {
				attr := &unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK,
					Bits: unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv}
				attr.Size = uint32(unsafe.Sizeof(*attr))
				return raw(nrPerfEventOpen, pin(attr), 0, neg1, neg1, unix.PERF_FLAG_FD_CLOEXEC)
			}, undo: closeFd}),

		// Item 22.
		sysProbe(sysSpec{id: "ptrace-peek-self", name: "ptrace(PTRACE_PEEKDATA, self)", cat: "syscalls", item: 22,
			call: func() (uintptr, unix.Errno) {
				v := new(uint64)
				return raw(nrPtrace, unix.PTRACE_PEEKDATA, uintptr(os.Getpid()), pin(v), 0)
			},
			reached: []unix.Errno{unix.ESRCH}}),
		{"ptrace-attach-child", "ptrace(PTRACE_ATTACH) to an own child", "syscalls", 22, func(p *Probe) {
			pid, err := syscall.ForkExec(selfExe, []string{selfExe, "-pause"}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}})
			p.ControlOK = err == nil
			p.Control = fmt.Sprintf("started a child (pid %d): %v", pid, err)
			if err != nil {
				p.NotProbed = "no child"
				return
			}
			defer func() {
				unix.Kill(pid, unix.SIGKILL)
				var ws syscall.WaitStatus
				syscall.Wait4(pid, &ws, 0, nil)
			}()
			_, e := raw(nrPtrace, unix.PTRACE_ATTACH, uintptr(pid), 0, 0)
			p.Errno = ename(e)
			if e == 0 {
				p.Detail = "attached to the child"
				raw(nrPtrace, unix.PTRACE_DETACH, uintptr(pid), 0, 0)
				return
			}
			p.Blocked, p.Detail = true, fmt.Sprintf("%s (%v)", ename(e), e)
		}},
		sysProbe(sysSpec{id: "process-vm-readv", name: "process_vm_readv(self)", cat: "syscalls", item: 22,
			call: func() (uintptr, unix.Errno) {
				src, dst := new([8]byte), new([8]byte)
				copy(src[:], "agentrun")
				local := &unix.Iovec{Base: &dst[0], Len: 8}
				remote := &unix.Iovec{Base: &src[0], Len: 8}
				pin(src)
				pin(dst)
				return raw(nrProcessVMReadv, uintptr(os.Getpid()), pin(local), 1, pin(remote), 1, 0)
			}}),
		sysProbe(sysSpec{id: "process-vm-writev", name: "process_vm_writev(self)", cat: "syscalls", item: 22,
			call: func() (uintptr, unix.Errno) {
				src, dst := new([8]byte), new([8]byte)
				local := &unix.Iovec{Base: &src[0], Len: 8}
				remote := &unix.Iovec{Base: &dst[0], Len: 8}
				pin(src)
				pin(dst)
				return raw(nrProcessVMWritev, uintptr(os.Getpid()), pin(local), 1, pin(remote), 1, 0)
			}}),

		// Item 23.
		sysProbe(sysSpec{id: "kexec-load", name: "kexec_load(0, 0, NULL, 0)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrKexecLoad, 0, 0, 0, 0) }, reached: []unix.Errno{unix.EINVAL}}),
		sysProbe(sysSpec{id: "kexec-file-load", name: "kexec_file_load(-1, -1, ...)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrKexecFileLoad, neg1, neg1, 0, 0, 0) }, reached: []unix.Errno{unix.EBADF, unix.EINVAL}}),
		sysProbe(sysSpec{id: "init-module", name: "init_module(NULL, 0, \"\")", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrInitModule, 0, 0, cstr("")) }, reached: []unix.Errno{unix.EFAULT, unix.ENOEXEC, unix.EINVAL}}),
		sysProbe(sysSpec{id: "finit-module", name: "finit_module(-1, \"\", 0)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrFinitModule, neg1, cstr(""), 0) }, reached: []unix.Errno{unix.EBADF}}),
		sysProbe(sysSpec{id: "delete-module", name: `delete_module("agentrun_none")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrDeleteModule, cstr("agentrun_none"), unix.O_NONBLOCK) }, reached: []unix.Errno{unix.ENOENT}}),
		sysProbe(sysSpec{id: "reboot", name: "reboot(bad magic)", cat: "syscalls", item: 23,
			call:    func() (uintptr, unix.Errno) { return raw(nrReboot, 1, 2, unix.LINUX_REBOOT_CMD_CAD_ON, 0) },
			reached: []unix.Errno{unix.EINVAL}}),
		sysProbe(sysSpec{id: "swapon", name: `swapon("/nonexistent")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrSwapon, cstr("/nonexistent"), 0) }, reached: []unix.Errno{unix.ENOENT}}),
		sysProbe(sysSpec{id: "swapoff", name: `swapoff("/nonexistent")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrSwapoff, cstr("/nonexistent")) }, reached: []unix.Errno{unix.ENOENT}}),
		sysProbe(sysSpec{id: "acct", name: `acct("/nonexistent")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrAcct, cstr("/nonexistent")) }, reached: []unix.Errno{unix.ENOENT}}),
		sysProbe(sysSpec{id: "settimeofday", name: "settimeofday(invalid time)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) {
				tv := &unix.Timeval{Sec: 1, Usec: 2000000}
				return raw(nrSettimeofday, pin(tv), 0)
			}, reached: []unix.Errno{unix.EINVAL}}),
		sysProbe(sysSpec{id: "clock-settime", name: "clock_settime(CLOCK_REALTIME, invalid time)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) {
				ts := &unix.Timespec{Sec: 1, Nsec: 2000000000}
				return raw(nrClockSettime, unix.CLOCK_REALTIME, pin(ts))
			}, reached: []unix.Errno{unix.EINVAL}}),
		sysProbe(sysSpec{id: "sethostname", name: `sethostname("sandbox")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrSethostname, cstr("sandbox"), 7) }}),
		sysProbe(sysSpec{id: "setdomainname", name: `setdomainname("(none)")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrSetdomainname, cstr("(none)"), 6) }}),
		sysProbe(sysSpec{id: "syslog-read", name: "syslog(SYSLOG_ACTION_READ_ALL)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) {
				_, p := buf(4096)
				return raw(nrSyslog, 3, p, 4096)
			}}),
		sysProbe(sysSpec{id: "syslog-size", name: "syslog(SYSLOG_ACTION_SIZE_BUFFER)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrSyslog, 10, 0, 0) }}),
		sysProbe(sysSpec{id: "iopl", name: "iopl(3)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrIopl, 3) }}),
		sysProbe(sysSpec{id: "ioperm", name: "ioperm(0x80, 1, 1)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrIoperm, 0x80, 1, 1) }}),
		{"open-by-handle-at", "open_by_handle_at with a real handle of / (shocker)", "syscalls", 23, func(p *Probe) {
			// The control gets a real handle with name_to_handle_at, which
			// the filter allows; the probe then tries to open it.
			hbuf := new([8 + 128]byte)
			*(*uint32)(unsafe.Pointer(&hbuf[0])) = 128
			mnt := new(int32)
			_, ce := raw(nrNameToHandleAt, atCwd, cstr("/etc"), pin(hbuf), pin(mnt), 0)
			p.ControlOK = ce == 0
			p.Control = "name_to_handle_at(/etc): " + errOrOK(ce)
			rootfd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				p.NotProbed = "open /: " + err.Error()
				return
			}
			defer unix.Close(rootfd)
			if ce != 0 {
				// Still probe with a made-up handle.
				*(*uint32)(unsafe.Pointer(&hbuf[0])) = 8
				*(*int32)(unsafe.Pointer(&hbuf[4])) = 1
			}
			r, e := raw(nrOpenByHandleAt, uintptr(rootfd), pin(hbuf), unix.O_RDONLY|unix.O_CLOEXEC)
			p.Errno = ename(e)
			if e == 0 {
				unix.Close(int(r))
				p.Detail = "opened a file by handle"
				return
			}
			p.Blocked, p.Detail = true, fmt.Sprintf("%s (%v)", ename(e), e)
		}},
		sysProbe(sysSpec{id: "kcmp", name: "kcmp(self, self, KCMP_FILE, 0, 0)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) {
				return raw(nrKcmp, uintptr(os.Getpid()), uintptr(os.Getpid()), 0, 0, 0)
			}}),
		sysProbe(sysSpec{id: "uselib", name: `uselib("/nonexistent")`, cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrUselib, cstr("/nonexistent")) }, reached: []unix.Errno{unix.ENOENT}}),
		sysProbe(sysSpec{id: "vhangup", name: "vhangup()", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrVhangup) }}),
		sysProbe(sysSpec{id: "quotactl", name: "quotactl(Q_GETFMT, /dev/vda)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) {
				v := new(uint32)
				//lint:ignore SA4016 spelled as the kernel's QCMD(Q_GETFMT, USRQUOTA)
				return raw(nrQuotactl, 0x800004<<8|0, cstr("/dev/vda"), 0, pin(v))
			}, reached: []unix.Errno{unix.ENOENT, unix.ENOTBLK}}),
		sysProbe(sysSpec{id: "lookup-dcookie", name: "lookup_dcookie(0, NULL, 0)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) { return raw(nrLookupDcookie, 0, 0, 0) }, reached: []unix.Errno{unix.EINVAL}}),
		// Docker's profile allows modify_ldt on x86 (for Wine and the
		// like); agentrun denies it as kernel attack surface.
		sysProbe(sysSpec{id: "modify-ldt", name: "modify_ldt(write)", cat: "syscalls", item: 23,
			call: func() (uintptr, unix.Errno) {
				d := new([16]byte)
				return raw(nrModifyLDT, 1, pin(d), 16)
			}}),

		// Item 24.
		sysProbe(sysSpec{id: "personality-read-implies-exec", name: "personality(READ_IMPLIES_EXEC)", cat: "syscalls", item: 24,
			call:    func() (uintptr, unix.Errno) { return raw(nrPersonality, 0x0400000) },
			control: ctlPersonality, undo: restorePersonality}),
		sysProbe(sysSpec{id: "personality-addr-no-randomize", name: "personality(ADDR_NO_RANDOMIZE)", cat: "syscalls", item: 24,
			call:    func() (uintptr, unix.Errno) { return raw(nrPersonality, 0x0040000) },
			control: ctlPersonality, undo: restorePersonality}),
		sysProbe(sysSpec{id: "personality-mmap-page-zero", name: "personality(MMAP_PAGE_ZERO)", cat: "syscalls", item: 24,
			call:    func() (uintptr, unix.Errno) { return raw(nrPersonality, 0x0100000) },
			control: ctlPersonality, undo: restorePersonality}),
	}
	return ps
}

func ctlPersonality() (bool, string) {
	r, e := raw(nrPersonality, 0xffffffff)
	return e == 0, fmt.Sprintf("personality(0xffffffff) (query) -> %#x %s", r, errOrOK(e))
}

func restorePersonality(uintptr) { raw(nrPersonality, 0) }

// abiProbes: other syscall ABIs and numbers (item 25).
func abiProbes() []probeDef {
	blockedErrs := []unix.Errno{unix.ENOSYS, unix.EPERM}
	ps := []probeDef{
		sysProbe(sysSpec{id: "nr-1000", name: "syscall 1000 (unknown)", cat: "abi", item: 25,
			call: func() (uintptr, unix.Errno) { return raw(1000) }, only: blockedErrs}),
		sysProbe(sysSpec{id: "nr-open-tree-attr", name: "syscall 467 open_tree_attr (newer than the profile)", cat: "abi", item: 25,
			call: func() (uintptr, unix.Errno) {
				return raw(nrOpenTreeAttr, atCwd, cstr("/"), unix.OPEN_TREE_CLONE, 0, 0)
			}}),
		sysProbe(sysSpec{id: "nr-file-setattr", name: "syscall 469 file_setattr (newer than the profile)", cat: "abi", item: 25,
			call: func() (uintptr, unix.Errno) { return raw(nrFileSetattr, ^uintptr(0), 0, 0, 0, 0) }, only: blockedErrs}),
		sysProbe(sysSpec{id: "nr-sysctl", name: "_sysctl (156, removed)", cat: "abi", item: 25,
			call: func() (uintptr, unix.Errno) { return raw(nrSysctl, 0) }, only: blockedErrs}),
		sysProbe(sysSpec{id: "nr-nfsservctl", name: "nfsservctl (180, removed)", cat: "abi", item: 25,
			call: func() (uintptr, unix.Errno) { return raw(nrNfsservctl, 0, 0, 0) }, only: blockedErrs}),
		sysProbe(sysSpec{id: "nr-create-module", name: "create_module (174, removed)", cat: "abi", item: 25,
			call: func() (uintptr, unix.Errno) { return raw(nrCreateModule, 0, 0) }, only: blockedErrs}),
	}
	for _, x := range []struct {
		id      string
		nr      uintptr
		args    []func() uintptr
		reached []unix.Errno
	}{
		{"unshare", nrUnshare, []func() uintptr{func() uintptr { return unix.CLONE_NEWUSER }}, nil},
		{"mount", nrMount, []func() uintptr{func() uintptr { return cstr("tmpfs") }, func() uintptr { return cstr(mntDir) }, func() uintptr { return cstr("tmpfs") }}, nil},
		{"keyctl", nrKeyctl, []func() uintptr{func() uintptr { return unix.KEYCTL_GET_KEYRING_ID }, func() uintptr { return 0xfffffffc }}, nil},
		{"setuid", nrSetuid, []func() uintptr{func() uintptr { return 0 }}, nil},
		{"getpid", nrGetpid, nil, nil},
	} {
		args := []string{}
		for _, f := range x.args {
			args = append(args, strconv.FormatUint(uint64(f()), 10))
		}
		ps = append(ps, abiProbe("x32-"+x.id, fmt.Sprintf("x32 %s (%d + 0x40000000)", x.id, x.nr), "-x32", int(nrGetpid), int(x.nr), args))
	}
	// i386 through int 0x80, each in a child: a fault there must not take
	// down the battery.
	for _, x := range []struct {
		id   string
		nr   int
		args []string
	}{
		{"unshare", 310, []string{strconv.Itoa(unix.CLONE_NEWUSER)}},
		{"mount", 21, []string{"cstr:tmpfs", "cstr:" + mntDir, "cstr:tmpfs"}},
		{"keyctl", 288, []string{"0", strconv.Itoa(0xfffffffc)}},
		{"setuid32", 213, []string{"0"}},
		{"ptrace", 26, []string{strconv.Itoa(unix.PTRACE_PEEKDATA), "1", "0"}},
		{"chroot", 61, []string{"cstr:/tmp"}},
	} {
		ps = append(ps, abiProbe("i386-"+x.id, fmt.Sprintf("i386 int 0x80 syscall %d (%s)", x.nr, x.id), "-int80", 20, x.nr, x.args))
	}
	return ps
}

// abiProbe runs a syscall of another ABI (mode -int80: i386, -x32: x32)
// in a child: a fault, or the filter killing the process, must not take
// down the battery. Blocked is an errno, or the whole child killed by
// SIGSYS; a call that kills only its thread leaves the program hanging
// and counts as not blocked. The control is getpid (ctlNR) through
// the same ABI in another child: it returns the child's pid where the ABI
// reaches the filter's rules, or the child dies of SIGSYS where the filter
// refuses the whole ABI, which blocks the probe as well.
func abiProbe(id, name, mode string, ctlNR, nr int, args []string) probeDef {
	return probeDef{id, name, "abi", 25, func(p *Probe) {
		ws, out, err := runChild([]string{selfExe, mode, strconv.Itoa(ctlNR)}, nil, nil)
		var pid, ret int
		var cerrno string
		n, _ := fmt.Sscanf(out, "%d %d %s", &pid, &ret, &cerrno)
		// The whole ABI refused: getpid kills the calling thread (the
		// filter's bad-arch action), or fails.
		abiRefused := err == nil && ((ws.Signaled() && ws.Signal() == unix.SIGSYS) || strings.Contains(out, threadKilled) || (ws.Exited() && n == 3 && ret < 0))
		p.ControlOK = abiRefused || (err == nil && ws.Exited() && ws.ExitStatus() == 0 && n >= 2 && pid == ret && pid > 0)
		p.Control = fmt.Sprintf("getpid through the same ABI in a child (%s, %v): %q", describeWait(ws), err, out)
		if !p.ControlOK {
			p.NotProbed = "this ABI does not work here (no IA-32 emulation?): " + p.Control
			return
		}
		ws, out, err = runChild(append([]string{selfExe, mode, strconv.Itoa(nr)}, args...), nil, nil)
		if err != nil {
			p.NotProbed = "starting the child: " + err.Error()
			return
		}
		if strings.Contains(out, threadKilled) {
			// Refused, but a program whose thread dies this way hangs
			// until its timeout: the call must be answered, or the whole
			// process killed.
			p.Detail = "only the calling thread was killed (the filter's bad-arch action): the rest of the process hangs"
			return
		}
		if ws.Signaled() {
			p.Blocked = ws.Signal() == unix.SIGSYS
			p.Detail = "the child was " + describeWait(ws) + " " + strings.TrimSpace(out)
			if p.Blocked {
				p.Errno = "SIGSYS"
				p.Detail = "the whole process was killed by SIGSYS"
			}
			return
		}
		var en string
		if _, err := fmt.Sscanf(out, "%d %d %s", &pid, &ret, &en); err != nil || ws.ExitStatus() != 0 {
			p.Detail = fmt.Sprintf("child %s printed %q", describeWait(ws), out)
			return
		}
		if ret >= 0 {
			p.Detail = fmt.Sprintf("succeeded, returned %d", ret)
			return
		}
		p.Errno = en
		// x86-64, x32 and i386 share errno values.
		p.Blocked = en == "EPERM" || en == "ENOSYS" || en == "EACCES"
		p.Detail = fmt.Sprintf("returned %d (%s)", ret, en)
	}}
}

// int80Child: -int80 NR [ARG...]; an ARG "cstr:S" is the address of S.
// It prints "pid ret errno".
func int80Child(args []string) {
	if len(args) == 0 {
		os.Exit(2)
	}
	nr, _ := strconv.Atoi(args[0])
	var a [3]uintptr
	for i, s := range args[1:] {
		if i >= 3 {
			break
		}
		if str, ok := cutPrefix(s, "cstr:"); ok {
			// The address must fit in 32 bits: use a low static buffer.
			a[i] = lowCstr(str)
			continue
		}
		v, _ := strconv.ParseInt(s, 10, 64)
		a[i] = uintptr(v)
	}
	fmt.Println(onOwnThread(func() string {
		r := int32(int80(uintptr(nr), a[0], a[1], a[2]))
		en := "OK"
		if r < 0 {
			en = ename(unix.Errno(-r))
		}
		return fmt.Sprintf("%d %d %s", os.Getpid(), r, en)
	}))
}

// threadKilled is what onOwnThread reports when the thread never came back.
const threadKilled = "THREAD-KILLED"

// onOwnThread runs fn on a thread of its own and returns its answer, or
// threadKilled if that thread does not come back: a seccomp filter's
// bad-arch action kills the calling thread, not the process.
func onOwnThread(fn func() string) string {
	ch := make(chan string, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread may be dead
		ch <- fn()
	}()
	select {
	case s := <-ch:
		return s
	case <-time.After(500 * time.Millisecond): // a syscall answers in microseconds
		return threadKilled
	}
}

// x32Child: -x32 NR [ARG...], numeric arguments; it makes syscall NR
// through the x32 ABI and prints "pid ret errno".
func x32Child(args []string) {
	if len(args) == 0 {
		os.Exit(2)
	}
	nr, _ := strconv.ParseUint(args[0], 10, 64)
	var a []uintptr
	for _, s := range args[1:] {
		v, _ := strconv.ParseUint(s, 10, 64)
		a = append(a, uintptr(v))
	}
	fmt.Println(onOwnThread(func() string {
		r, e := raw(uintptr(nr)|x32Bit, a...)
		en := "OK"
		ret := int64(r)
		if e != 0 {
			en, ret = ename(e), -1
		}
		return fmt.Sprintf("%d %d %s", os.Getpid(), ret, en)
	}))
}

func cutPrefix(s, p string) (string, bool) {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):], true
	}
	return s, false
}

// lowCstr copies s to memory mapped below 4 GiB, so that a 32-bit syscall
// argument can point at it.
func lowCstr(s string) uintptr {
	b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_32BIT)
	if err != nil {
		return 0
	}
	copy(b, s)
	return uintptr(unsafe.Pointer(&b[0]))
}
