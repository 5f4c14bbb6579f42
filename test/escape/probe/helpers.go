//go:build linux && amd64

package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pinned keeps every buffer whose address a raw syscall gets: storing the
// pointer here makes it escape to the (non-moving) heap and stay alive.
var pinned []unsafe.Pointer

// pin returns p's address for a raw syscall argument.
func pin[T any](p *T) uintptr {
	pinned = append(pinned, unsafe.Pointer(p))
	return uintptr(unsafe.Pointer(p))
}

// cstr returns the address of a NUL-terminated copy of s.
func cstr(s string) uintptr {
	b := append([]byte(s), 0)
	return pin(&b[0])
}

// buf returns a zeroed buffer of n bytes and its address.
func buf(n int) ([]byte, uintptr) {
	b := make([]byte, n)
	return b, pin(&b[0])
}

// raw makes syscall nr with up to six arguments, without telling the Go
// scheduler (for calls that never block).
func raw(nr uintptr, a ...uintptr) (uintptr, unix.Errno) {
	var x [6]uintptr
	copy(x[:], a)
	r, _, e := unix.RawSyscall6(nr, x[0], x[1], x[2], x[3], x[4], x[5])
	return r, e
}

// ename is an errno's symbolic name ("" for 0).
func ename(e unix.Errno) string {
	if e == 0 {
		return ""
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return "errno" + strconv.Itoa(int(e))
}

// errnoOf digs the errno out of an error ("" if none).
func errnoOf(err error) unix.Errno {
	for err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return e
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return 0
		}
		err = u.Unwrap()
	}
	return 0
}

func errName(err error) string {
	if err == nil {
		return ""
	}
	if e := errnoOf(err); e != 0 {
		return ename(e)
	}
	return "error"
}

func in(e unix.Errno, set []unix.Errno) bool {
	for _, x := range set {
		if e == x {
			return true
		}
	}
	return false
}

// Syscall numbers, x86-64, written out so that no wrapper is involved.
const (
	nrOpen            = 2
	nrGetpid          = 39
	nrSocket          = 41
	nrPtrace          = 101
	nrSyslog          = 103
	nrSetuid          = 105
	nrSetgid          = 106
	nrSetgroups       = 116
	nrSetresuid       = 117
	nrCapget          = 125
	nrMknod           = 133
	nrUselib          = 134
	nrPersonality     = 135
	nrVhangup         = 153
	nrModifyLDT       = 154
	nrPivotRoot       = 155
	nrSysctl          = 156
	nrPrctl           = 157
	nrSetrlimit       = 160
	nrChroot          = 161
	nrAcct            = 163
	nrSettimeofday    = 164
	nrMount           = 165
	nrUmount2         = 166
	nrSwapon          = 167
	nrSwapoff         = 168
	nrReboot          = 169
	nrSethostname     = 170
	nrSetdomainname   = 171
	nrIopl            = 172
	nrIoperm          = 173
	nrCreateModule    = 174
	nrInitModule      = 175
	nrDeleteModule    = 176
	nrQuotactl        = 179
	nrNfsservctl      = 180
	nrLookupDcookie   = 212
	nrClockSettime    = 227
	nrKexecLoad       = 246
	nrAddKey          = 248
	nrRequestKey      = 249
	nrKeyctl          = 250
	nrUnshare         = 272
	nrPerfEventOpen   = 298
	nrNameToHandleAt  = 303
	nrOpenByHandleAt  = 304
	nrSetns           = 308
	nrProcessVMReadv  = 310
	nrProcessVMWritev = 311
	nrKcmp            = 312
	nrFinitModule     = 313
	nrMemfdCreate     = 319
	nrKexecFileLoad   = 320
	nrBPF             = 321
	nrUserfaultfd     = 323
	nrIOUringSetup    = 425
	nrIOUringEnter    = 426
	nrIOUringRegister = 427
	nrOpenTree        = 428
	nrMoveMount       = 429
	nrFsopen          = 430
	nrFsconfig        = 431
	nrFsmount         = 432
	nrFspick          = 433
	nrClone3          = 435
	nrMountSetattr    = 442
	nrOpenTreeAttr    = 467
	nrFileSetattr     = 469

	x32Bit = 0x40000000
)

// Controls shared by many probes.

// ctlGetpid proves raw syscalls work and return values: getpid by number
// must give this process's pid.
func ctlGetpid() (bool, string) {
	r, e := raw(nrGetpid)
	ok := e == 0 && int(r) == os.Getpid()
	return ok, fmt.Sprintf("raw getpid(39) -> %d %s (pid %d)", int(r), ename(e), os.Getpid())
}

// ctlWriteTmp proves open(O_WRONLY|O_CREAT) and write work where they should.
func ctlWriteTmp() (bool, string) {
	fd, e := openRaw("/tmp/agentrun-probe-ctl", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if e != 0 {
		return false, "open /tmp/agentrun-probe-ctl O_WRONLY|O_CREAT: " + ename(e)
	}
	defer unix.Close(fd)
	if n, err := unix.Write(fd, []byte("x")); n != 1 || err != nil {
		return false, fmt.Sprintf("write /tmp: %d %v", n, err)
	}
	return true, "open+write /tmp/agentrun-probe-ctl ok"
}

// openRaw is open(2) by number.
func openRaw(path string, flags int, mode uint32) (int, unix.Errno) {
	r, e := raw(nrOpen, cstr(path), uintptr(flags), uintptr(mode))
	if e != 0 {
		return -1, e
	}
	return int(r), 0
}

// readAll reads a file through raw open/read, at most max bytes.
func readAll(path string, max int) ([]byte, unix.Errno) {
	fd, e := openRaw(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if e != 0 {
		return nil, e
	}
	defer unix.Close(fd)
	var out []byte
	b := make([]byte, 65536)
	for len(out) < max {
		n, err := unix.Read(fd, b)
		if n > 0 {
			out = append(out, b[:n]...)
		}
		if err != nil {
			return out, errnoOf(err)
		}
		if n == 0 {
			break
		}
	}
	return out, 0
}

// statusField returns a /proc/self/status field's value.
func statusField(status []byte, key string) (string, bool) {
	for _, line := range bytes.Split(status, []byte("\n")) {
		k, v, ok := strings.Cut(string(line), ":")
		if ok && k == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// listDir lists a directory by raw getdents (without . and ..).
func listDir(path string) ([]string, unix.Errno) {
	fd, e := openRaw(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if e != 0 {
		return nil, e
	}
	defer unix.Close(fd)
	var names []string
	b := make([]byte, 32768)
	for {
		n, err := unix.ReadDirent(fd, b)
		if err != nil {
			return names, errnoOf(err)
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(b[:n], -1, names)
	}
	return names, 0
}

func sameFile(a, b *unix.Stat_t) bool { return a.Dev == b.Dev && a.Ino == b.Ino }

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// mountinfoLine is one line of /proc/self/mountinfo.
type mountinfoLine struct {
	root, point, opts, fstype, source, superOpts string
	raw                                          string
}

func mountinfo() ([]mountinfoLine, unix.Errno) {
	b, e := readAll("/proc/self/mountinfo", 1<<20)
	if e != 0 {
		return nil, e
	}
	var out []mountinfoLine
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		m := mountinfoLine{root: f[3], point: f[4], opts: f[5], raw: line}
		for i := 6; i < len(f); i++ {
			if f[i] == "-" && i+3 < len(f) {
				m.fstype, m.source, m.superOpts = f[i+1], f[i+2], f[i+3]
				break
			}
		}
		out = append(out, m)
	}
	return out, 0
}

// lastMount is the topmost mount at point.
func lastMount(ms []mountinfoLine, point string) (mountinfoLine, bool) {
	var found mountinfoLine
	ok := false
	for _, m := range ms {
		if m.point == point {
			found, ok = m, true
		}
	}
	return found, ok
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// copySelf copies this program's binary to path with mode.
func copySelf(path string, mode os.FileMode) error {
	b, err := os.ReadFile(selfExe)
	if err != nil {
		return err
	}
	os.Remove(path)
	if err := os.WriteFile(path, b, mode); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

// runChild starts argv (argv[0] a path) and waits; it returns the exit
// status, the child's stdout and the error of the start (an errno when the
// kernel refused).
func runChild(argv []string, attr *syscall.SysProcAttr, extra []uintptr) (syscall.WaitStatus, string, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return 0, "", err
	}
	files := []uintptr{0, uintptr(p[1]), 2}
	files = append(files, extra...)
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: []string{"PATH=/bin"}, Files: files, Sys: attr})
	unix.Close(p[1])
	if err != nil {
		unix.Close(p[0])
		return 0, "", err
	}
	var out []byte
	b := make([]byte, 4096)
	for {
		n, rerr := unix.Read(p[0], b)
		if n > 0 {
			out = append(out, b[:n]...)
		}
		if n <= 0 || rerr != nil {
			break
		}
	}
	unix.Close(p[0])
	var ws syscall.WaitStatus
	for {
		_, werr := syscall.Wait4(pid, &ws, 0, nil)
		if werr != syscall.EINTR {
			break
		}
	}
	return ws, string(out), nil
}

func describeWait(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit %d", ws.ExitStatus())
	case ws.Signaled():
		return "killed by " + unix.SignalName(ws.Signal())
	}
	return fmt.Sprintf("status %#x", int(ws))
}
