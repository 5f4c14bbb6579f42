//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func resourceProbes(o *Options) []probeDef {
	return []probeDef{
		{"uts-hostname", "the sandbox has its own hostname", "namespaces", 0, func(p *Probe) {
			var u unix.Utsname
			err := unix.Uname(&u)
			node := unix.ByteSliceToString(u.Nodename[:])
			p.ControlOK = err == nil && node != ""
			p.Control = fmt.Sprintf("uname: %v, nodename %q", err, node)
			p.Blocked = node != "" && (o.HostHostname == "" || node != o.HostHostname)
			p.Detail = fmt.Sprintf("nodename %q, host's %q", node, o.HostHostname)
		}},
		{"rlimit-nofile-emfile", "opening files past RLIMIT_NOFILE gives EMFILE", "resources", 31, func(p *Probe) {
			var rl unix.Rlimit
			gerr := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
			var fds []int
			var last unix.Errno
			for len(fds) < 1<<17 {
				fd, e := openRaw("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if e != 0 {
					last = e
					break
				}
				fds = append(fds, fd)
			}
			for _, fd := range fds {
				unix.Close(fd)
			}
			p.ControlOK = gerr == nil && len(fds) > 0
			p.Control = fmt.Sprintf("getrlimit: %v (soft %d hard %d); the first open worked: %v", gerr, rl.Cur, rl.Max, len(fds) > 0)
			p.Errno = ename(last)
			p.Blocked = last == unix.EMFILE && uint64(len(fds)) < rl.Cur && rl.Cur <= 1<<20
			p.Detail = fmt.Sprintf("opened %d files, then %s; limit %d/%d", len(fds), ename(last), rl.Cur, rl.Max)
		}},
		sysProbe(sysSpec{id: "rlimit-nofile-raise", name: "raise the RLIMIT_NOFILE hard limit", cat: "resources", item: 31,
			call: func() (uintptr, unix.Errno) {
				var rl unix.Rlimit
				unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
				nl := &unix.Rlimit{Cur: rl.Cur, Max: rl.Max + 1}
				return raw(nrSetrlimit, unix.RLIMIT_NOFILE, pin(nl))
			},
			control: func() (bool, string) {
				// Setting the same limits again is allowed.
				rl := new(unix.Rlimit)
				unix.Getrlimit(unix.RLIMIT_NOFILE, rl)
				_, e := raw(nrSetrlimit, unix.RLIMIT_NOFILE, pin(rl))
				return e == 0, fmt.Sprintf("setrlimit(NOFILE, %d/%d) (unchanged): %s", rl.Cur, rl.Max, errOrOK(e))
			}}),
		{"rlimit-core-zero", "RLIMIT_CORE is 0 and cannot be raised", "resources", 31, func(p *Probe) {
			var rl unix.Rlimit
			gerr := unix.Getrlimit(unix.RLIMIT_CORE, &rl)
			nl := &unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}
			_, e := raw(nrSetrlimit, unix.RLIMIT_CORE, pin(nl))
			p.ControlOK = gerr == nil
			p.Control = fmt.Sprintf("getrlimit(CORE): %v", gerr)
			p.Errno = ename(e)
			p.Blocked = rl.Cur == 0 && rl.Max == 0 && e != 0
			p.Detail = fmt.Sprintf("core limit %d/%d; raising it: %s", rl.Cur, rl.Max, errOrOK(e))
		}},
		{"tmp-enospc", "filling /tmp stops at its size with ENOSPC", "resources", 3, func(p *Probe) {
			path := "/tmp/agentrun-probe-fill"
			fd, e := openRaw(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
			if e != 0 {
				p.Control = "open " + path + ": " + ename(e)
				return
			}
			defer os.Remove(path)
			defer unix.Close(fd)
			chunk := make([]byte, 1<<20)
			var written int64
			var last error
			for written <= o.TmpSize+32<<20 {
				n, err := unix.Write(fd, chunk)
				written += int64(max(n, 0))
				if err != nil {
					last = err
					break
				}
			}
			p.ControlOK = written > 0
			p.Control = fmt.Sprintf("wrote %d bytes before the error", written)
			p.Errno = errName(last)
			p.Blocked = last != nil && written <= o.TmpSize
			p.Detail = fmt.Sprintf("wrote %d bytes into a /tmp of %d, then %v", written, o.TmpSize, last)
		}},
		{"fork-pids-limit", "forking stops at the pids limit (EAGAIN)", "resources", 27, func(p *Probe) {
			ws, out, err := runChild([]string{selfExe, "-forkbomb", strconv.Itoa(o.Pids + 16)}, nil, nil)
			reapAll()
			var n int
			var en string
			k, _ := fmt.Sscanf(out, "%d %s", &n, &en)
			p.ControlOK = err == nil && k == 2 && n >= 1
			p.Control = fmt.Sprintf("the fork-bomb child (%s, %v) forked %d children first", describeWait(ws), err, n)
			p.Errno = en
			p.Blocked = k == 2 && en != "OK" && n < o.Pids
			p.Detail = fmt.Sprintf("%d forks, then %s; pids limit %d; child %s", n, en, o.Pids, describeWait(ws))
		}},
	}
}

// forkBombChild: -forkbomb MAX forks sleepers until fork fails or MAX, then
// kills them and prints "count errno".
func forkBombChild(args []string) {
	runtime.LockOSThread()
	max := 100
	if len(args) > 0 {
		max, _ = strconv.Atoi(args[0])
	}
	argv := []string{"/bin/sleep", "30"}
	if _, err := os.Stat(argv[0]); err != nil {
		argv = []string{selfExe, "-pause"}
	}
	var pids []int
	en := "OK"
	for len(pids) < max {
		pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{})
		if err != nil {
			en = errName(err)
			break
		}
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		unix.Kill(pid, unix.SIGKILL)
	}
	for _, pid := range pids {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}
	fmt.Printf("%d %s\n", len(pids), en)
}

// reapAll kills and reaps whatever the fork bomb left, when this process is
// the namespace's init (kill(-1) then reaches only the sandbox).
func reapAll() {
	if os.Getpid() != 1 {
		return
	}
	unix.Kill(-1, unix.SIGKILL)
	for {
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(-1, &ws, 0, nil); err == syscall.ECHILD || err != nil && err != syscall.EINTR {
			return
		}
	}
}
