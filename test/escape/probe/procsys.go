//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openWriteProbe: open(path, O_WRONLY) must fail. Nothing is ever written,
// even when the open succeeds: several of these files change the host.
// The control opens a /tmp file for writing and records whether the target
// exists.
func openWriteProbe(id, name, cat string, item int, path string) probeDef {
	return probeDef{id, name, cat, item, func(p *Probe) {
		fd, e := openRaw(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if e == 0 {
			unix.Close(fd)
			p.Detail = "open " + path + " O_WRONLY succeeded (nothing written)"
		} else {
			p.Blocked, p.Errno = true, ename(e)
			p.Detail = "open " + path + " O_WRONLY: " + e.Error()
		}
		ok, c := ctlWriteTmp()
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err == nil {
			c += fmt.Sprintf("; %s exists, mode %o", path, st.Mode&0o7777)
		} else {
			c += fmt.Sprintf("; %s: %v", path, err)
		}
		p.ControlOK, p.Control = ok, c
	}}
}

func procSysProbes(o *Options) []probeDef {
	ps := []probeDef{
		openWriteProbe("procsys-core-pattern", "open /proc/sys/kernel/core_pattern for writing", "proc/sys", 9, "/proc/sys/kernel/core_pattern"),
		openWriteProbe("procsys-modprobe", "open /proc/sys/kernel/modprobe for writing", "proc/sys", 9, "/proc/sys/kernel/modprobe"),
		openWriteProbe("procsys-binfmt-register", "open /proc/sys/fs/binfmt_misc/register for writing", "proc/sys", 9, "/proc/sys/fs/binfmt_misc/register"),
		openWriteProbe("procsys-sysrq", "open /proc/sys/kernel/sysrq for writing", "proc/sys", 9, "/proc/sys/kernel/sysrq"),
		openWriteProbe("procsys-drop-caches", "open /proc/sys/vm/drop_caches for writing", "proc/sys", 9, "/proc/sys/vm/drop_caches"),
		openWriteProbe("procsys-hostname", "open /proc/sys/kernel/hostname for writing", "proc/sys", 9, "/proc/sys/kernel/hostname"),
		openWriteProbe("procsys-ip-forward", "open /proc/sys/net/ipv4/ip_forward for writing", "proc/sys", 9, "/proc/sys/net/ipv4/ip_forward"),
		openWriteProbe("proc-irq-affinity", "open /proc/irq/default_smp_affinity for writing", "proc/sys", 9, "/proc/irq/default_smp_affinity"),
		openWriteProbe("proc-sysrq-trigger", "open /proc/sysrq-trigger for writing", "proc/sys", 10, "/proc/sysrq-trigger"),
		{"procsys-mount-readonly", "/proc/sys, /proc/bus, /proc/fs, /proc/irq, /proc/sysrq-trigger are read-only mounts", "proc/sys", 9, func(p *Probe) {
			ms, e := mountinfo()
			var d []string
			all, found := true, 0
			for _, pt := range []string{"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sysrq-trigger"} {
				m, ok := lastMount(ms, pt)
				if !ok {
					var st unix.Stat_t
					if unix.Stat(pt, &st) != nil {
						d = append(d, pt+" absent")
						continue
					}
					d = append(d, pt+" exists but is not a read-only mount")
					all = false
					continue
				}
				found++
				all = all && hasOpt(m.opts, "ro")
				d = append(d, pt+" "+m.opts)
			}
			p.ControlOK = e == 0 && found > 0
			p.Control = fmt.Sprintf("mountinfo read, %d mounts found", found)
			p.Blocked = all
			p.Detail = strings.Join(d, "; ")
		}},
	}
	for _, f := range []string{"kcore", "keys", "timer_list", "sched_debug", "interrupts", "latency_stats", "timer_stats"} {
		ps = append(ps, maskedFileProbe("masked-proc-"+strings.ReplaceAll(f, "_", "-"), "/proc/"+f))
	}
	for _, d := range []string{"/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/devices/virtual/powercap"} {
		ps = append(ps, maskedDirProbe("masked"+strings.ReplaceAll(strings.ReplaceAll(d, "/", "-"), "_", "-"), d))
	}
	ps = append(ps,
		probeDef{"kallsyms-addresses-hidden", "/proc/kallsyms shows no kernel addresses", "proc/sys", 11, func(p *Probe) {
			b, e := readAll("/proc/kallsyms", 1<<16)
			p.ControlOK = e == 0 || e == unix.ENOENT || e == unix.EACCES
			p.Control = "read /proc/kallsyms: " + errOrOK(e)
			if e != 0 {
				p.Blocked, p.Errno, p.Detail = true, ename(e), "read /proc/kallsyms: "+e.Error()
				return
			}
			nonzero := 0
			lines := strings.Split(string(b), "\n")
			for _, l := range lines {
				if f := strings.Fields(l); len(f) > 0 && strings.Trim(f[0], "0") != "" {
					nonzero++
				}
			}
			p.Blocked = nonzero == 0
			p.Detail = fmt.Sprintf("%d bytes read, %d lines with a non-zero address", len(b), nonzero)
		}},
	)
	for _, f := range []string{"/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state", "/sys/kernel/profiling"} {
		ps = append(ps, openWriteProbe("sys-write"+strings.ReplaceAll(strings.ReplaceAll(strings.TrimPrefix(f, "/sys"), "/", "-"), "_", "-"), "open "+f+" for writing", "sys", 12, f))
	}
	ps = append(ps,
		probeDef{"sys-cgroup-release-agent", "open every cgroup release_agent for writing (CVE-2022-0492)", "sys", 12, func(p *Probe) {
			paths := []string{"/sys/fs/cgroup/release_agent"}
			m, _ := filepath.Glob("/sys/fs/cgroup/*/release_agent")
			paths = append(paths, m...)
			var opened, all []string
			for _, path := range paths {
				fd, e := openRaw(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
				if e == 0 {
					unix.Close(fd)
					opened = append(opened, path)
					all = append(all, path+"=OPENED")
					continue
				}
				if p.Errno == "" {
					p.Errno = ename(e)
				}
				all = append(all, path+"="+ename(e))
			}
			names, e := listDir("/sys/fs/cgroup")
			p.ControlOK, _ = ctlWriteTmp()
			p.Control = fmt.Sprintf("/tmp writable; /sys/fs/cgroup lists %d entries (%s)", len(names), errOrOK(e))
			p.Blocked = len(opened) == 0
			p.Detail = strings.Join(all, " ")
		}},
		probeDef{"sys-mount-readonly", "/sys is mounted read-only", "sys", 12, func(p *Probe) {
			ms, e := mountinfo()
			m, ok := lastMount(ms, "/sys")
			c, re := readAll("/sys/devices/system/cpu/online", 4096)
			p.ControlOK = e == 0 && ok && re == 0 && len(c) > 0
			p.Control = fmt.Sprintf("mountinfo has /sys: %v; read /sys/devices/system/cpu/online: %d bytes %s", ok, len(c), errOrOK(re))
			p.Blocked = ok && hasOpt(m.opts, "ro")
			p.Detail = "/sys options " + m.opts
			for _, x := range ms {
				if strings.HasPrefix(x.point, "/sys/") && !hasOpt(x.opts, "ro") {
					p.Blocked = false
					p.Detail += "; writable submount " + x.point + " " + x.opts
				}
			}
		}},
		probeDef{"proc-only-sandbox-pids", "/proc lists only the sandbox's processes", "proc/sys", 13, func(p *Probe) {
			names, e := listDir("/proc")
			self, _ := os.Readlink("/proc/self")
			var pids, foreign []string
			sawSelf := false
			for _, n := range names {
				if _, err := strconv.Atoi(n); err != nil {
					continue
				}
				pids = append(pids, n)
				if n == self {
					sawSelf = true
				}
				st, _ := readAll("/proc/"+n+"/status", 8192)
				uid, _ := statusField(st, "Uid")
				if f := strings.Fields(uid); len(f) > 0 && f[0] != strconv.Itoa(os.Getuid()) {
					foreign = append(foreign, n+"(uid "+f[0]+")")
				}
			}
			p.ControlOK = e == 0 && sawSelf
			p.Control = fmt.Sprintf("/proc listed (%s), own pid %s found: %v", errOrOK(e), self, sawSelf)
			p.Blocked = inSandbox() && len(foreign) == 0 && len(pids) <= 8
			p.Detail = fmt.Sprintf("getpid %d; pids %v", os.Getpid(), pids)
			if len(foreign) > 0 {
				p.Detail += "; other users' processes: " + strings.Join(foreign, " ")
			}
		}},
	)
	return ps
}

// maskedFileProbe: the file reads 0 bytes or is absent. The control reads
// /proc/uptime.
func maskedFileProbe(id, path string) probeDef {
	return probeDef{id, path + " is masked (reads empty or absent)", "proc/sys", 11, func(p *Probe) {
		b, e := readAll(path, 4096)
		switch {
		case e == 0 && len(b) == 0:
			p.Blocked, p.Detail = true, "read 0 bytes"
		case e != 0 && len(b) == 0:
			p.Blocked, p.Errno, p.Detail = true, ename(e), "read: "+e.Error()
		default:
			p.Detail = fmt.Sprintf("read %d bytes: %q", len(b), trunc(string(b), 120))
		}
		c, ce := readAll("/proc/uptime", 4096)
		p.ControlOK = ce == 0 && len(c) > 0
		p.Control = fmt.Sprintf("read /proc/uptime: %d bytes %s", len(c), errOrOK(ce))
	}}
}

// maskedDirProbe: the directory lists empty or is absent. The control lists
// /proc/self.
func maskedDirProbe(id, path string) probeDef {
	return probeDef{id, path + " is masked (lists empty or absent)", "proc/sys", 11, func(p *Probe) {
		names, e := listDir(path)
		switch {
		case e == 0 && len(names) == 0:
			p.Blocked, p.Detail = true, "lists empty"
		case e != 0 && len(names) == 0:
			p.Blocked, p.Errno, p.Detail = true, ename(e), "list: "+e.Error()
		default:
			p.Detail = fmt.Sprintf("lists %d entries: %s", len(names), trunc(strings.Join(names, " "), 200))
		}
		c, ce := listDir("/proc/self")
		p.ControlOK = ce == 0 && len(c) > 0
		p.Control = fmt.Sprintf("list /proc/self: %d entries %s", len(c), errOrOK(ce))
	}}
}
