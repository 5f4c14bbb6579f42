//go:build linux && amd64

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// fdProbes runs first, before this program opens anything (item 5).
func fdProbes() []probeDef {
	return []probeDef{
		{"fd-only-stdio", "only fds 0-2 are open (CVE-2024-21626)", "filesystem", 5, func(p *Probe) {
			dirfd, e := openRaw("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if e != 0 {
				p.Control = "open /proc/self/fd: " + ename(e)
				p.Errno = ename(e)
				return
			}
			var names []string
			b := make([]byte, 8192)
			for {
				n, err := unix.ReadDirent(dirfd, b)
				if err != nil || n <= 0 {
					break
				}
				_, _, names = unix.ParseDirent(b[:n], -1, names)
			}
			var extra, all []string
			sawDir := false
			for _, n := range names {
				fd, _ := strconv.Atoi(n)
				target, _ := os.Readlink("/proc/self/fd/" + n)
				all = append(all, n+"="+target)
				switch {
				case fd == dirfd:
					sawDir = true
				case fd <= 2:
				default:
					extra = append(extra, n+"="+target)
				}
			}
			unix.Close(dirfd)
			p.ControlOK = sawDir
			p.Control = fmt.Sprintf("the listing shows the probe's own directory fd %d: %v", dirfd, sawDir)
			p.Blocked = len(extra) == 0
			p.Detail = "fds: " + strings.Join(all, " ")
			if len(extra) > 0 {
				p.Detail = "extra fds open: " + strings.Join(extra, " ") + "; " + p.Detail
			}
		}},
		{"fd-stdio-targets", "fds 0-2 are pipes, sockets or /dev/null, not host files", "filesystem", 5, func(p *Probe) {
			var bad, all []string
			for fd := 0; fd <= 2; fd++ {
				t, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
				if err != nil {
					all = append(all, fmt.Sprintf("%d=(%s)", fd, errName(err)))
					continue
				}
				all = append(all, fmt.Sprintf("%d=%s", fd, t))
				ok := strings.HasPrefix(t, "pipe:") || strings.HasPrefix(t, "socket:") || t == "/dev/null" ||
					strings.HasPrefix(t, "/dev/pts/") || strings.HasPrefix(t, "anon_inode:")
				if !ok {
					bad = append(bad, fmt.Sprintf("%d=%s", fd, t))
				}
			}
			p.Blocked = len(bad) == 0
			p.Detail = strings.Join(all, " ")
			t, err := os.Readlink("/proc/self/exe")
			p.ControlOK = err == nil && t != ""
			p.Control = fmt.Sprintf("readlink /proc/self/exe -> %q %s", t, errName(err))
		}},
		{"cwd-inside-root", "/proc/self/cwd and root resolve inside the sandbox root", "filesystem", 5, func(p *Probe) {
			cwd, err1 := os.Readlink("/proc/self/cwd")
			root, err2 := os.Readlink("/proc/self/root")
			var dot, slash, link, up unix.Stat_t
			e1 := unix.Stat(".", &dot)
			e2 := unix.Stat("/", &slash)
			e3 := unix.Stat(cwd, &link)
			e4 := unix.Stat(strings.Repeat("../", 40), &up)
			p.ControlOK = e2 == nil && e1 == nil
			p.Control = fmt.Sprintf("stat . %v, stat / %v", e1, e2)
			p.Blocked = err1 == nil && err2 == nil && e3 == nil && e4 == nil &&
				strings.HasPrefix(cwd, "/") && !strings.Contains(cwd, "unreachable") && root == "/" &&
				sameFile(&dot, &link) && sameFile(&up, &slash)
			p.Detail = fmt.Sprintf("cwd %q (%v), root %q (%v), stat(cwd) same as . %v, 40x.. reaches / %v", cwd, err1, root, err2,
				e3 == nil && sameFile(&dot, &link), e4 == nil && sameFile(&up, &slash))
		}},
	}
}

// writeProbe: open(path, flags) must fail; the control writes /tmp.
func writeProbe(id, name string, item int, path string, flags int) probeDef {
	return probeDef{id, name, "filesystem", item, func(p *Probe) {
		fd, e := openRaw(path, flags|unix.O_CLOEXEC, 0o644)
		if e == 0 {
			unix.Close(fd)
			if flags&unix.O_CREAT != 0 {
				unix.Unlink(path)
			}
			p.Detail = "open " + path + " for writing succeeded"
		} else {
			p.Blocked, p.Errno = true, ename(e)
			p.Detail = "open " + path + ": " + e.Error()
		}
		p.ControlOK, p.Control = ctlWriteTmp()
	}}
}

// execProbe copies this binary into dir and tries to run it; exec of
// /proc/self/exe is the control.
func execProbe(id, dir string) probeDef {
	return probeDef{id, "exec from " + dir + " fails (noexec)", "filesystem", 2, func(p *Probe) {
		path := filepath.Join(dir, "agentrun-probe-exec")
		ctlExec(p)
		if err := copySelf(path, 0o755); err != nil {
			p.NotProbed = "copying the probe into " + dir + ": " + err.Error()
			return
		}
		defer os.Remove(path)
		ws, _, err := runChild([]string{path, "-noop"}, nil, nil)
		if err != nil {
			p.Blocked, p.Errno, p.Detail = true, errName(err), "exec "+path+": "+err.Error()
			return
		}
		p.Detail = "exec " + path + " ran: " + describeWait(ws)
	}}
}

func ctlExec(p *Probe) {
	ws, _, err := runChild([]string{selfExe, "-noop"}, nil, nil)
	p.ControlOK = err == nil && ws.Exited() && ws.ExitStatus() == 0
	p.Control = fmt.Sprintf("exec /proc/self/exe -noop: %v %s", err, describeWait(ws))
}

func fsProbes(o *Options) []probeDef {
	ps := []probeDef{
		writeProbe("write-root-newfile", "create /agentrun-probe-newfile on the read-only root", 1, "/agentrun-probe-newfile", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL),
		writeProbe("write-etc-passwd", "open /etc/passwd for writing", 1, "/etc/passwd", unix.O_WRONLY),
		writeProbe("write-probe-binary", "open /probe (the running binary, in the image) for writing", 1, "/probe", unix.O_WRONLY),
		{"mkdir-root", "mkdir on the read-only root", "filesystem", 1, func(p *Probe) {
			err := unix.Mkdir("/agentrun-probe-dir", 0o755)
			if err == nil {
				unix.Rmdir("/agentrun-probe-dir")
				p.Detail = "mkdir /agentrun-probe-dir succeeded"
			} else {
				p.Blocked, p.Errno, p.Detail = true, errName(err), "mkdir /agentrun-probe-dir: "+err.Error()
			}
			os.Remove("/tmp/agentrun-probe-mkdir")
			cerr := unix.Mkdir("/tmp/agentrun-probe-mkdir", 0o755)
			p.ControlOK, p.Control = cerr == nil, fmt.Sprintf("mkdir /tmp/agentrun-probe-mkdir: %v", cerr)
		}},
		{"root-mount-readonly", "/ is mounted read-only", "filesystem", 1, func(p *Probe) {
			ms, e := mountinfo()
			m, ok := lastMount(ms, "/")
			p.ControlOK = e == 0 && ok
			p.Control = fmt.Sprintf("mountinfo read (%d lines), / found %v", len(ms), ok)
			p.Blocked = ok && hasOpt(m.opts, "ro")
			p.Detail = "/ options " + m.opts
		}},
		{"tmp-mount-options", "/tmp, /workspace and /dev/shm are nosuid,nodev,noexec", "filesystem", 2, func(p *Probe) {
			ms, e := mountinfo()
			var d []string
			all, found := true, 0
			for _, pt := range []string{"/tmp", "/workspace", "/dev/shm"} {
				m, ok := lastMount(ms, pt)
				if !ok {
					d = append(d, pt+" not a mount")
					all = false
					continue
				}
				found++
				good := hasOpt(m.opts, "nosuid") && hasOpt(m.opts, "nodev") && hasOpt(m.opts, "noexec")
				all = all && good
				d = append(d, pt+" "+m.opts)
			}
			p.ControlOK = e == 0 && found > 0
			p.Control = fmt.Sprintf("mountinfo read, %d of 3 mounts found", found)
			p.Blocked = all
			p.Detail = strings.Join(d, "; ")
		}},
		execProbe("exec-tmp", "/tmp"),
		execProbe("exec-workspace", "/workspace"),
		execProbe("exec-devshm", "/dev/shm"),
		{"mmap-exec-tmp", "mmap PROT_EXEC of a file in /tmp fails (noexec)", "filesystem", 2, func(p *Probe) {
			path := "/tmp/agentrun-probe-mmap"
			if err := os.WriteFile(path, make([]byte, 4096), 0o755); err != nil {
				p.NotProbed = "writing " + path + ": " + err.Error()
				return
			}
			defer os.Remove(path)
			tryMmap := func(path string, prot int) error {
				fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				b, err := unix.Mmap(fd, 0, 4096, prot, unix.MAP_PRIVATE)
				if err == nil {
					unix.Munmap(b)
				}
				return err
			}
			err := tryMmap(path, unix.PROT_READ|unix.PROT_EXEC)
			if err != nil {
				p.Blocked, p.Errno, p.Detail = true, errName(err), "mmap PROT_EXEC "+path+": "+err.Error()
			} else {
				p.Detail = "mmap PROT_EXEC " + path + " succeeded"
			}
			c1 := tryMmap(path, unix.PROT_READ)
			c2 := tryMmap(selfExe, unix.PROT_READ|unix.PROT_EXEC)
			p.ControlOK = c1 == nil && c2 == nil
			p.Control = fmt.Sprintf("mmap PROT_READ of the same file: %v; mmap PROT_EXEC of /proc/self/exe: %v", c1, c2)
		}},
		{"setuid-bit-in-tmp", "a setuid file made in /tmp cannot be run", "filesystem", 2, func(p *Probe) {
			path := "/tmp/agentrun-probe-suid"
			if err := copySelf(path, 0o755); err != nil {
				p.NotProbed = "copying: " + err.Error()
				return
			}
			defer os.Remove(path)
			cerr := unix.Chmod(path, 0o4755)
			var st unix.Stat_t
			serr := unix.Stat(path, &st)
			p.ControlOK = serr == nil
			p.Control = fmt.Sprintf("chmod 4755: %v; stat: %v, mode %o", cerr, serr, st.Mode&0o7777)
			ws, out, err := runChild([]string{path, "-whoami"}, nil, nil)
			if err != nil {
				p.Blocked, p.Errno, p.Detail = true, errName(err), "exec "+path+": "+err.Error()
				return
			}
			p.Detail = fmt.Sprintf("exec ran (%s): %s", describeWait(ws), strings.TrimSpace(out))
		}},
		{"exec-memfd", "memfd_create + exec runs native code (noexec is not an exec boundary)", "filesystem", 2, func(p *Probe) {
			p.Info = true
			ctlExec(p)
			b, err := os.ReadFile(selfExe)
			if err != nil {
				p.NotProbed = err.Error()
				return
			}
			r, e := raw(nrMemfdCreate, cstr("agentrun-probe"), 0)
			if e != 0 {
				p.Blocked, p.Errno, p.Detail = true, ename(e), "memfd_create: "+e.Error()
				return
			}
			fd := int(r)
			defer unix.Close(fd)
			unix.Write(fd, b)
			ws, _, err := runChild([]string{"/proc/self/fd/3", "-noop"}, nil, []uintptr{uintptr(fd)})
			if err != nil {
				p.Blocked, p.Errno, p.Detail = true, errName(err), "exec memfd: "+err.Error()
				return
			}
			p.Detail = "exec of a memfd ran: " + describeWait(ws)
		}},
		{"dev-listing", "/dev holds only the standard devices: no mem, kmsg, port or block devices", "filesystem", 4, func(p *Probe) {
			type dev struct{ maj, min uint32 }
			allowed := map[dev]string{{1, 3}: "null", {1, 5}: "zero", {1, 7}: "full", {1, 8}: "random", {1, 9}: "urandom",
				{5, 0}: "tty", {5, 1}: "console", {5, 2}: "ptmx"}
			var bad, all []string
			var walk func(dir string, depth int)
			walk = func(dir string, depth int) {
				names, _ := listDir(dir)
				sort.Strings(names)
				for _, n := range names {
					path := dir + "/" + n
					var st unix.Stat_t
					if unix.Lstat(path, &st) != nil {
						continue
					}
					switch st.Mode & unix.S_IFMT {
					case unix.S_IFDIR:
						all = append(all, path+"/")
						if depth < 3 {
							walk(path, depth+1)
						}
					case unix.S_IFBLK:
						bad = append(bad, fmt.Sprintf("%s (block %d:%d)", path, unix.Major(st.Rdev), unix.Minor(st.Rdev)))
					case unix.S_IFCHR:
						d := dev{unix.Major(st.Rdev), unix.Minor(st.Rdev)}
						all = append(all, fmt.Sprintf("%s(%d:%d)", path, d.maj, d.min))
						if _, ok := allowed[d]; !ok && d.maj != 136 { // 136: pts slaves
							bad = append(bad, fmt.Sprintf("%s (char %d:%d)", path, d.maj, d.min))
						}
					default:
						all = append(all, path)
					}
				}
			}
			walk("/dev", 0)
			for _, n := range []string{"/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/fuse", "/dev/net/tun", "/dev/kvm"} {
				var st unix.Stat_t
				if unix.Stat(n, &st) == nil {
					bad = append(bad, n+" exists")
				}
			}
			var null unix.Stat_t
			err := unix.Stat("/dev/null", &null)
			fd, e := openRaw("/dev/null", unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if e == 0 {
				unix.Close(fd)
			}
			p.ControlOK = err == nil && null.Mode&unix.S_IFMT == unix.S_IFCHR && e == 0 && len(all) > 0
			p.Control = fmt.Sprintf("/dev/null is char %d:%d and opens for writing (%s); %d entries listed", unix.Major(null.Rdev), unix.Minor(null.Rdev), ename(e), len(all))
			p.Blocked = len(bad) == 0
			p.Detail = trunc(strings.Join(all, " "), 600)
			if len(bad) > 0 {
				p.Detail = "unexpected: " + strings.Join(bad, ", ") + "; " + p.Detail
			}
		}},
		mknodProbe("mknod-block-8-0", "mknod a block device 8:0 (sda)", unix.S_IFBLK|0o600, 8, 0),
		mknodProbe("mknod-char-1-1", "mknod a char device 1:1 (/dev/mem)", unix.S_IFCHR|0o600, 1, 1),
		mknodProbe("mknod-char-1-11", "mknod a char device 1:11 (/dev/kmsg)", unix.S_IFCHR|0o600, 1, 11),
		{"proc-self-exe-wronly", "open /proc/self/exe for writing (CVE-2019-5736)", "filesystem", 6, func(p *Probe) {
			exeWrite(p, []string{"/proc/self/exe"})
		}},
		{"proc-all-exe-wronly", "open every /proc/<pid>/exe for writing", "filesystem", 6, func(p *Probe) {
			names, _ := listDir("/proc")
			var paths []string
			for _, n := range names {
				if _, err := strconv.Atoi(n); err == nil {
					paths = append(paths, "/proc/"+n+"/exe")
				}
			}
			exeWrite(p, paths)
		}},
		{"proc-self-exe-reopen", "reopen an O_PATH fd of /proc/self/exe for writing through /proc/self/fd", "filesystem", 6, func(p *Probe) {
			fd, err := unix.Open("/proc/self/exe", unix.O_PATH|unix.O_CLOEXEC, 0)
			p.ControlOK = err == nil
			p.Control = fmt.Sprintf("open /proc/self/exe O_PATH: %v", err)
			if err != nil {
				p.NotProbed = "no O_PATH fd"
				return
			}
			defer unix.Close(fd)
			wfd, e := openRaw("/proc/self/fd/"+strconv.Itoa(fd), unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if e == 0 {
				unix.Close(wfd)
				p.Detail = "reopen for writing succeeded"
				return
			}
			p.Blocked, p.Errno, p.Detail = true, ename(e), "reopen /proc/self/fd/N O_WRONLY: "+e.Error()
		}},
		{"mountinfo-host-paths", "mountinfo shows no host state paths or daemon sockets", "filesystem", 7, func(p *Probe) {
			ms, e := mountinfo()
			var hits []string
			for _, m := range ms {
				for _, hp := range o.HostPaths {
					if strings.Contains(m.raw, hp) {
						hits = append(hits, hp+" in: "+m.raw)
					}
				}
			}
			p.ControlOK = e == 0 && len(ms) > 3
			p.Control = fmt.Sprintf("mountinfo read: %d mounts", len(ms))
			p.Blocked = len(hits) == 0
			var roots []string
			for _, m := range ms {
				roots = append(roots, m.point+"<-"+m.root)
			}
			p.Detail = fmt.Sprintf("checked %d paths %v; mount<-root: %s", len(o.HostPaths), o.HostPaths, trunc(strings.Join(roots, " "), 900))
			if len(hits) > 0 {
				p.Detail = "host paths visible: " + strings.Join(hits, " | ")
			}
		}},
		{"mountinfo-image-path", "mountinfo does not reveal the image's host directory", "filesystem", 7, func(p *Probe) {
			p.Info = true
			ms, e := mountinfo()
			p.ControlOK = e == 0 && len(ms) > 0
			p.Control = fmt.Sprintf("mountinfo read: %d mounts", len(ms))
			if o.ImagePath == "" {
				p.NotProbed = "no -imagepath given"
				return
			}
			p.Blocked = true
			for _, m := range ms {
				if strings.Contains(m.raw, o.ImagePath) {
					p.Blocked = false
					p.Detail = "visible: " + m.raw
					return
				}
			}
			p.Detail = o.ImagePath + " not in mountinfo"
		}},
		{"sockets-under-root", "no unix sockets anywhere in the filesystem (but the probe's own)", "filesystem", 7, func(p *Probe) {
			own := "/tmp/agentrun-probe.sock"
			os.Remove(own)
			s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				err = unix.Bind(s, &unix.SockaddrUnix{Name: own})
				defer unix.Close(s)
				defer os.Remove(own)
			}
			var found []string
			sawOwn, n := false, 0
			var walk func(dir string)
			walk = func(dir string) {
				if n > 50000 {
					return
				}
				names, _ := listDir(dir)
				for _, name := range names {
					n++
					path := strings.TrimSuffix(dir, "/") + "/" + name
					if path == "/proc" || path == "/sys" {
						continue
					}
					var st unix.Stat_t
					if unix.Lstat(path, &st) != nil {
						continue
					}
					switch st.Mode & unix.S_IFMT {
					case unix.S_IFDIR:
						walk(path)
					case unix.S_IFSOCK:
						if path == own {
							sawOwn = true
						} else {
							found = append(found, path)
						}
					}
				}
			}
			walk("/")
			p.ControlOK = err == nil && sawOwn
			p.Control = fmt.Sprintf("bound %s (%v); the walk found it: %v", own, err, sawOwn)
			p.Blocked = len(found) == 0
			p.Detail = fmt.Sprintf("walked %d entries outside /proc and /sys", n)
			if len(found) > 0 {
				p.Detail = "sockets: " + strings.Join(found, " ")
			}
		}},
		{"dotdot-root", `stat("/../..") is "/"`, "filesystem", 8, func(p *Probe) {
			var root, up, up2, tmp unix.Stat_t
			e1 := unix.Stat("/", &root)
			e2 := unix.Stat("/../..", &up)
			e3 := unix.Stat("/tmp/../../../..", &up2)
			e4 := unix.Stat("/tmp", &tmp)
			p.ControlOK = e1 == nil && e4 == nil && !sameFile(&root, &tmp)
			p.Control = fmt.Sprintf("stat / %v and /tmp %v: different inodes %v", e1, e4, !sameFile(&root, &tmp))
			p.Blocked = e2 == nil && e3 == nil && sameFile(&root, &up) && sameFile(&root, &up2)
			p.Detail = fmt.Sprintf("/ dev %d ino %d; /../.. dev %d ino %d; /tmp/../../../.. dev %d ino %d", root.Dev, root.Ino, up.Dev, up.Ino, up2.Dev, up2.Ino)
		}},
	}
	return ps
}

func mknodProbe(id, name string, mode uint32, maj, min uint32) probeDef {
	return probeDef{id, name, "filesystem", 4, func(p *Probe) {
		path := "/tmp/agentrun-probe-" + id
		os.Remove(path)
		_, e := raw(nrMknod, cstr(path), uintptr(mode), uintptr(unix.Mkdev(maj, min)))
		if e == 0 {
			os.Remove(path)
			p.Detail = "mknod " + path + " succeeded"
		} else {
			p.Blocked, p.Errno, p.Detail = true, ename(e), "mknod: "+e.Error()
		}
		fifo := "/tmp/agentrun-probe-fifo"
		os.Remove(fifo)
		_, ce := raw(nrMknod, cstr(fifo), uintptr(unix.S_IFIFO|0o600), 0)
		os.Remove(fifo)
		p.ControlOK = ce == 0
		p.Control = "raw mknod of a FIFO in /tmp: " + errOrOK(ce)
	}}
}

func errOrOK(e unix.Errno) string {
	if e == 0 {
		return "ok"
	}
	return ename(e)
}

func exeWrite(p *Probe, paths []string) {
	var open, all []string
	var errno string
	for _, path := range paths {
		fd, e := openRaw(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if e == 0 {
			unix.Close(fd)
			open = append(open, path)
			all = append(all, path+"=OPENED")
			continue
		}
		if errno == "" {
			errno = ename(e)
		}
		all = append(all, path+"="+ename(e))
	}
	fd, e := openRaw("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if e == 0 {
		unix.Close(fd)
	}
	p.ControlOK = e == 0 && len(paths) > 0
	p.Control = fmt.Sprintf("open /proc/self/exe O_RDONLY: %s; %d exe links tried", errOrOK(e), len(paths))
	p.Blocked = len(open) == 0
	p.Errno = errno
	p.Detail = trunc(strings.Join(all, " "), 600)
}
