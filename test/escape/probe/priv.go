//go:build linux && amd64

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysSpec is a raw-syscall probe. By default any failure counts as blocked;
// reached lists errnos that mean the call got past the seccomp filter and
// the privilege checks (so it is NOT blocked), and only, when set, lists the
// sole errnos that count as blocked.
type sysSpec struct {
	id, name, cat string
	item          int
	call          func() (uintptr, unix.Errno)
	reached       []unix.Errno
	only          []unix.Errno
	control       func() (bool, string)
	undo          func(r uintptr) // after a success
}

func sysProbe(s sysSpec) probeDef {
	return probeDef{s.id, s.name, s.cat, s.item, func(p *Probe) {
		r, e := s.call()
		p.Errno = ename(e)
		switch {
		case e == 0:
			p.Detail = fmt.Sprintf("succeeded, returned %d", int64(r))
			if s.undo != nil {
				s.undo(r)
			}
		case s.only != nil && !in(e, s.only):
			p.Detail = fmt.Sprintf("%s (%v): the kernel ran the call; only %v would mean blocked", ename(e), e, names(s.only))
		case in(e, s.reached):
			p.Detail = fmt.Sprintf("%s (%v): the call got past the filter and the privilege checks", ename(e), e)
		default:
			p.Blocked = true
			p.Detail = fmt.Sprintf("%s (%v)", ename(e), e)
		}
		ctl := s.control
		if ctl == nil {
			ctl = ctlGetpid
		}
		p.ControlOK, p.Control = ctl()
	}}
}

func names(es []unix.Errno) []string {
	var out []string
	for _, e := range es {
		out = append(out, ename(e))
	}
	return out
}

func closeFd(r uintptr) { unix.Close(int(r)) }

// ident is what -whoami prints.
type ident struct {
	UID, EUID, GID, EGID int
	CapEff, CapPrm       string
}

func whoami() {
	st, _ := readAll("/proc/self/status", 1<<16)
	eff, _ := statusField(st, "CapEff")
	prm, _ := statusField(st, "CapPrm")
	b, _ := json.Marshal(ident{os.Getuid(), os.Geteuid(), os.Getgid(), os.Getegid(), eff, prm})
	os.Stdout.Write(append(b, '\n'))
}

func pause() {
	for {
		unix.Pause()
	}
}

// elevatedExecProbe runs a setuid-root or file-capability copy of the probe
// in the image: no_new_privs must keep it at uid 65534 with no capabilities.
func elevatedExecProbe(id, name, path string) probeDef {
	return probeDef{id, name, "privileges", 16, func(p *Probe) {
		ws, out, err := runChild([]string{selfExe, "-whoami"}, nil, nil)
		var me ident
		jerr := json.Unmarshal([]byte(out), &me)
		p.ControlOK = err == nil && jerr == nil && me.EUID == os.Geteuid()
		p.Control = fmt.Sprintf("exec of the plain probe -whoami (%s): %s", describeWait(ws), strings.TrimSpace(out))
		if path == "" {
			p.NotProbed = "the harness could not install the binary (no path given)"
			return
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			p.NotProbed = "stat " + path + ": " + err.Error()
			return
		}
		ws, out, err = runChild([]string{path, "-whoami"}, nil, nil)
		if err != nil {
			p.Blocked, p.Errno, p.Detail = true, errName(err), "exec: "+err.Error()
			return
		}
		var id ident
		if jerr := json.Unmarshal([]byte(out), &id); jerr != nil {
			p.Detail = fmt.Sprintf("exec (%s) printed %q", describeWait(ws), out)
			return
		}
		p.Blocked = id.EUID == os.Geteuid() && id.UID == os.Getuid() && id.EGID == os.Getegid() &&
			strings.Trim(id.CapEff, "0") == "" && strings.Trim(id.CapPrm, "0") == ""
		p.Detail = fmt.Sprintf("%s mode %o owner %d: ran as %s", path, st.Mode&0o7777, st.Uid, strings.TrimSpace(out))
	}}
}

// inRange reports whether id is one of the config's run_uids.
func (o *Options) inRange(id int64) bool { return id >= o.UIDFirst && id < o.UIDFirst+o.UIDCount }

// runID is the /proc/self/status Uid (or Gid) line of a sandbox whose
// uid is id: id four times when it is one of run_uids.
func (o *Options) runID(id int) string {
	if !o.inRange(int64(id)) {
		return fmt.Sprintf("one id of run_uids %d+%d, four times", o.UIDFirst, o.UIDCount)
	}
	return strings.Repeat(strconv.Itoa(id)+"\t", 3) + strconv.Itoa(id)
}

func privProbes(o *Options) []probeDef {
	statusCheck := func(id, name string, item int, want map[string]string) probeDef {
		return probeDef{id, name, "privileges", item, func(p *Probe) {
			st, e := readAll("/proc/self/status", 1<<16)
			nm, hasName := statusField(st, "Name")
			p.ControlOK = e == 0 && hasName
			p.Control = fmt.Sprintf("read /proc/self/status (%s): Name %q", errOrOK(e), nm)
			p.Blocked = true
			var d []string
			for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "Gid", "Groups"} {
				w, ok := want[k]
				if !ok {
					continue
				}
				v, present := statusField(st, k)
				if v != w || !present {
					p.Blocked = false
					d = append(d, fmt.Sprintf("%s=%q (want %q)", k, v, w))
				} else {
					d = append(d, fmt.Sprintf("%s=%q", k, v))
				}
			}
			p.Detail = strings.Join(d, " ")
		}}
	}
	z := "0000000000000000"
	ps := []probeDef{
		statusCheck("status-caps-zero", "every capability set is empty", 14, map[string]string{"CapInh": z, "CapPrm": z, "CapEff": z, "CapBnd": z, "CapAmb": z}),
		statusCheck("status-nnp-seccomp", "NoNewPrivs 1 and Seccomp 2 (filter)", 14, map[string]string{"NoNewPrivs": "1", "Seccomp": "2"}),
		statusCheck("status-ids", "uid and gid one id of run_uids, no supplementary groups", 15, map[string]string{
			"Uid": o.runID(os.Getuid()), "Gid": o.runID(os.Getuid()), "Groups": ""}),
		{"capget-zero", "capget(2) reports no capabilities", "privileges", 14, func(p *Probe) {
			hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			data := &[2]unix.CapUserData{}
			_, e := raw(nrCapget, pin(hdr), pin(&data[0]))
			p.ControlOK = e == 0
			p.Control = "raw capget: " + errOrOK(e)
			p.Blocked = e == 0
			for _, d := range data {
				if d.Effective|d.Permitted|d.Inheritable != 0 {
					p.Blocked = false
				}
			}
			p.Detail = fmt.Sprintf("%+v", *data)
		}},
		{"prctl-nnp-seccomp", "prctl reports no_new_privs 1 and seccomp mode 2", "privileges", 14, func(p *Probe) {
			nnp, e1 := raw(nrPrctl, unix.PR_GET_NO_NEW_PRIVS)
			sec, e2 := raw(nrPrctl, unix.PR_GET_SECCOMP)
			ka, e3 := raw(nrPrctl, unix.PR_GET_KEEPCAPS)
			p.ControlOK = e3 == 0
			p.Control = fmt.Sprintf("prctl(PR_GET_KEEPCAPS) -> %d %s", ka, errOrOK(e3))
			p.Blocked = e1 == 0 && nnp == 1 && e2 == 0 && sec == 2
			p.Detail = fmt.Sprintf("PR_GET_NO_NEW_PRIVS %d %s; PR_GET_SECCOMP %d %s", nnp, errOrOK(e1), sec, errOrOK(e2))
		}},
		{"capbset-empty", "PR_CAPBSET_READ is 0 for every capability", "privileges", 14, func(p *Probe) {
			var set []int
			valid := 0
			for c := 0; c < 64; c++ {
				r, e := raw(nrPrctl, unix.PR_CAPBSET_READ, uintptr(c))
				if e == 0 {
					valid++
					if r != 0 {
						set = append(set, c)
					}
				}
			}
			p.ControlOK = valid >= 38
			p.Control = fmt.Sprintf("PR_CAPBSET_READ answered for %d capabilities", valid)
			p.Blocked = len(set) == 0
			p.Detail = fmt.Sprintf("capabilities in the bounding set: %v", set)
		}},
		sysProbe(sysSpec{id: "cap-ambient-raise", name: "prctl(PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN)", cat: "privileges", item: 14,
			call: func() (uintptr, unix.Errno) {
				return raw(nrPrctl, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, unix.CAP_SYS_ADMIN)
			},
			control: func() (bool, string) {
				r, e := raw(nrPrctl, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, unix.CAP_SYS_ADMIN)
				return e == 0 && r == 0, fmt.Sprintf("PR_CAP_AMBIENT_IS_SET(CAP_SYS_ADMIN) -> %d %s", r, errOrOK(e))
			}}),
		{"getres-ids", "getresuid/getresgid are one id of run_uids and getgroups is empty", "privileges", 15, func(p *Probe) {
			var r, e, s, rg, eg, sg uint32
			_, e1 := raw(118, pin(&r), pin(&e), pin(&s))    // getresuid
			_, e2 := raw(120, pin(&rg), pin(&eg), pin(&sg)) // getresgid
			n, e3 := raw(115, 0, 0)                         // getgroups(0, NULL)
			p.ControlOK = e1 == 0 && e2 == 0 && e3 == 0
			p.Control = fmt.Sprintf("raw getresuid %s getresgid %s getgroups %s", errOrOK(e1), errOrOK(e2), errOrOK(e3))
			p.Blocked = o.inRange(int64(r)) && e == r && s == r && rg == r && eg == r && sg == r && n == 0
			p.Detail = fmt.Sprintf("uid %d/%d/%d gid %d/%d/%d groups %d", r, e, s, rg, eg, sg, n)
		}},
		elevatedExecProbe("setuid-root-binary", "a setuid-root binary in the image runs as the sandbox's uid", o.SuidPath),
		elevatedExecProbe("file-caps-binary", "a binary with effective file capabilities gains none (or is refused)", o.FcapsPath),
		elevatedExecProbe("file-caps-noeff-binary", "a binary with permitted (not effective) file capabilities gains none", o.FcapsNoEff),
		sysProbe(sysSpec{id: "setuid-0", name: "setuid(0)", cat: "privileges", item: 17,
			call:    func() (uintptr, unix.Errno) { return raw(nrSetuid, 0) },
			control: ctlSetuidSelf}),
		sysProbe(sysSpec{id: "setgid-0", name: "setgid(0)", cat: "privileges", item: 17,
			call:    func() (uintptr, unix.Errno) { return raw(nrSetgid, 0) },
			control: ctlSetuidSelf}),
		sysProbe(sysSpec{id: "setresuid-0", name: "setresuid(0,0,0)", cat: "privileges", item: 17,
			call:    func() (uintptr, unix.Errno) { return raw(nrSetresuid, 0, 0, 0) },
			control: ctlSetuidSelf}),
		sysProbe(sysSpec{id: "setgroups-0", name: "setgroups(1, [0])", cat: "privileges", item: 17,
			call: func() (uintptr, unix.Errno) {
				g := new(uint32)
				return raw(nrSetgroups, 1, pin(g))
			},
			control: ctlSetuidSelf}),
		sysProbe(sysSpec{id: "chroot", name: `chroot("/tmp")`, cat: "privileges", item: 17,
			call: func() (uintptr, unix.Errno) { return raw(nrChroot, cstr("/tmp")) },
			control: func() (bool, string) {
				_, e := raw(80, cstr(".")) // chdir(".")
				return e == 0, "raw chdir(\".\"): " + errOrOK(e)
			}}),
	}
	// Unsharing a user namespace in a multi-threaded process gives EINVAL
	// once past the filter: that is "reached".
	for _, u := range []struct {
		id    string
		flags uintptr
	}{{"user", unix.CLONE_NEWUSER}, {"mnt", unix.CLONE_NEWNS}, {"net", unix.CLONE_NEWNET}, {"pid", unix.CLONE_NEWPID},
		{"ipc", unix.CLONE_NEWIPC}, {"uts", unix.CLONE_NEWUTS}, {"cgroup", unix.CLONE_NEWCGROUP}, {"time", unix.CLONE_NEWTIME}} {
		var reached []unix.Errno
		if u.flags == unix.CLONE_NEWUSER || u.flags == unix.CLONE_NEWNS {
			reached = []unix.Errno{unix.EINVAL}
		}
		ps = append(ps, sysProbe(sysSpec{id: "unshare-" + u.id, name: "unshare(CLONE_NEW" + strings.ToUpper(u.id) + ")", cat: "namespaces", item: 18,
			call: func() (uintptr, unix.Errno) { return raw(nrUnshare, u.flags) }, reached: reached}))
	}
	for _, c := range []struct {
		id    string
		flags uintptr
	}{{"user", unix.CLONE_NEWUSER}, {"mnt-pid-net", unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET},
		{"mnt", unix.CLONE_NEWNS}, {"pid", unix.CLONE_NEWPID}, {"net", unix.CLONE_NEWNET},
		{"ipc", unix.CLONE_NEWIPC}, {"uts", unix.CLONE_NEWUTS}, {"cgroup", unix.CLONE_NEWCGROUP}} {
		ps = append(ps, probeDef{"clone-new" + c.id, fmt.Sprintf("clone(%#x) of a child running -noop", c.flags), "namespaces", 18, func(p *Probe) {
			ctlExec(p)
			ws, _, err := runChild([]string{selfExe, "-noop"}, &syscall.SysProcAttr{Cloneflags: c.flags}, nil)
			if err != nil {
				p.Blocked, p.Errno, p.Detail = true, errName(err), "clone: "+err.Error()
				return
			}
			p.Detail = "a child in new namespaces ran: " + describeWait(ws)
		}})
	}
	ps = append(ps, sysProbe(sysSpec{id: "clone3", name: "clone3(NULL, 0)", cat: "namespaces", item: 18,
		call:    func() (uintptr, unix.Errno) { return raw(nrClone3, 0, 0) },
		reached: []unix.Errno{unix.EINVAL, unix.E2BIG, unix.EFAULT}}))
	ps = append(ps, clone3Probes()...)
	return ps
}

func ctlSetuidSelf() (bool, string) {
	_, e := raw(nrSetuid, uintptr(os.Getuid()))
	_, e2 := raw(nrSetgid, uintptr(os.Getgid()))
	return e == 0 && e2 == 0, fmt.Sprintf("raw setuid(%d) %s, setgid(%d) %s", os.Getuid(), errOrOK(e), os.Getgid(), errOrOK(e2))
}
