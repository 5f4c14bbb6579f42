package toolbroker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// A stdio server started by root runs fenced: agentrun starts itself
// again (/proc/self/exe) as the server's fence init, in a new pid, mount,
// IPC, UTS and cgroup namespace and, unless the server is given a network
// of its own, a new network namespace, all made by clone. The init, still
// root, sets up the server's view and then becomes the server: it
// executes the server's command in its place, as pid 1 of its pid
// namespace, so that the server's end (or its kill) ends every process it
// made. What it does, in order (fenceInit):
//
//   - /, recursively, is made private, so nothing it mounts reaches the
//     host; a proc of the new pid namespace is mounted on /proc, so the
//     server sees its own processes alone; a fresh tmpfs is mounted on
//     each of /tmp, /var/tmp and /dev/shm that exists, so no file there is
//     shared with the host, another server or a sandbox;
//   - its network: it joins the namespace on fenceNetFD (a veth to a proxy
//     that lets it reach its config's hosts, with that proxy's
//     resolv.conf and hosts bound over the host's), or brings the
//     loopback of its fresh namespace up (nothing else is there);
//   - its privileges: the bounding, ambient and inheritable capability
//     sets are emptied, then its groups, gid and uid set (the pool's id:
//     the permitted and effective sets empty with it), no_new_privs set
//     (no setuid bit or file capability gives anything back) and the
//     parent-death signal set again (a change of uid clears it);
//   - it checks every capability set is empty, and executes the command
//     with its environment alone.
//
// Any failure is written on fenceErrFD and the init exits 126 without
// executing anything; the descriptor is close-on-exec, so agentrun reads
// its end to EOF to learn that the command was executed.
const (
	// fenceArg0 and fenceEnv mark the fence init: its argv[0] and its
	// environment's only variable. agentrun itself is never started so.
	fenceArg0 = "agentrun-tool-fence"
	fenceEnv  = "_AGENTRUN_TOOL_FENCE=1"
	// The init's descriptors beyond stdio: the spec (read to EOF), the
	// error pipe, and the network namespace to join (when given).
	fenceSpecFD = 3
	fenceErrFD  = 4
	fenceNetFD  = 5
	// maxFenceSpec bounds the spec the init reads: a command and an
	// environment within the config's bounds.
	maxFenceSpec = 16 << 20
	// maxFenceErr bounds the failure agentrun reads of an init.
	maxFenceErr = 4 << 10
	// fenceTmpfs is the mount options of each private tmpfs: its pages are
	// charged to the server's cgroup, and bounded here too.
	fenceTmpfs = "size=64m,nr_inodes=16384"
)

// fenceFlags are the namespaces the clone of a fence init makes; a server
// without a network of its own gets a fresh network namespace too.
const fenceFlags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP

// fenceSpec is what the init is told on fenceSpecFD.
type fenceSpec struct {
	Argv   []string `json:"argv"`
	Env    []string `json:"env"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
	// Netns: fenceNetFD is the network namespace to join, and ResolvConf
	// and Hosts are bound over /etc's.
	Netns      bool   `json:"netns"`
	ResolvConf []byte `json:"resolv_conf,omitempty"`
	Hosts      []byte `json:"hosts,omitempty"`
}

// A fence init is agentrun started again: this package's init turns the
// process into it before main, on the main thread (the runtime locks the
// main goroutine to it while packages initialize).
func init() {
	if len(os.Args) == 1 && os.Args[0] == fenceArg0 && len(os.Environ()) == 1 && os.Environ()[0] == fenceEnv {
		fenceMain()
	}
}

// fenceMain runs the fence init; it never returns.
func fenceMain() {
	runtime.LockOSThread()
	errPipe := os.NewFile(fenceErrFD, "fence-errors")
	err := fenceInit()
	// fenceInit returns only when it failed.
	fmt.Fprintf(errPipe, "%v", err)
	os.Exit(126)
}

// fenceInit sets the server's view and privileges up and executes its
// command; it returns only on a failure.
func fenceInit() error {
	unix.CloseOnExec(fenceErrFD)
	spec, err := readFenceSpec(os.NewFile(fenceSpecFD, "fence-spec"))
	if err != nil {
		return err
	}
	if len(spec.Argv) == 0 || spec.UID == 0 || spec.GID == 0 || len(spec.Groups) > 1 {
		return errors.New("fence: bad spec")
	}
	if err := fenceMounts(); err != nil {
		return err
	}
	if err := fenceNetwork(spec); err != nil {
		return err
	}
	if err := dropPrivileges(spec); err != nil {
		return err
	}
	if err := syscall.Exec(spec.Argv[0], spec.Argv, spec.Env); err != nil {
		return fmt.Errorf("executing %s: %w", spec.Argv[0], err)
	}
	return nil
}

// readFenceSpec reads and closes f: one JSON fenceSpec, within
// maxFenceSpec.
func readFenceSpec(f *os.File) (*fenceSpec, error) {
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFenceSpec+1))
	if err != nil || len(b) > maxFenceSpec {
		return nil, fmt.Errorf("fence: reading the spec: %v (%d bytes)", err, len(b))
	}
	var spec fenceSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("fence: reading the spec: %w", err)
	}
	return &spec, nil
}

// fenceDirs are the directories of the host where a fresh tmpfs, the
// server's own, is mounted (when the host has them as directories), and
// its mode: the world-writable ones, whose files and sockets other users
// share, and /run, where the host's services keep their sockets (serve's,
// D-Bus's, the journal's).
var fenceDirs = []struct{ dir, mode string }{
	{"/tmp", "1777"}, {"/var/tmp", "1777"}, {"/dev/shm", "1777"}, {"/run", "755"}, {"/var/run", "755"},
}

// fenceMounts makes every mount private, mounts the new pid namespace's
// proc on /proc, and a fresh tmpfs on each of fenceDirs.
func fenceMounts() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("fence: making / private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("fence: mounting /proc: %w", err)
	}
	for _, d := range fenceDirs {
		if st, err := os.Lstat(d.dir); err != nil || !st.IsDir() {
			continue // absent on this host, or a link (/var/run to /run): not followed
		}
		if err := unix.Mount("tmpfs", d.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+d.mode+","+fenceTmpfs); err != nil {
			return fmt.Errorf("fence: mounting a tmpfs on %s: %w", d.dir, err)
		}
	}
	return nil
}

// fenceNetwork joins the server's network namespace and binds its
// resolv.conf and hosts, or brings the fresh namespace's loopback up.
func fenceNetwork(spec *fenceSpec) error {
	if !spec.Netns {
		return loopbackUp()
	}
	// setns changes this thread alone: the one that executes the command.
	if err := unix.Setns(fenceNetFD, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("fence: joining the server's network namespace: %w", err)
	}
	unix.Close(fenceNetFD)
	// The files are written in the private /tmp, bound read-only over
	// /etc's and removed: the mounts keep them.
	dir, err := os.MkdirTemp("/tmp", ".agentrun-net-")
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	defer os.RemoveAll(dir)
	for name, content := range map[string][]byte{"resolv.conf": spec.ResolvConf, "hosts": spec.Hosts} {
		src := filepath.Join(dir, name)
		if err := os.WriteFile(src, content, 0o444); err != nil {
			return fmt.Errorf("fence: %w", err)
		}
		dst, err := bindTarget("/etc/" + name)
		if err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("fence: binding /etc/%s: %w", name, err)
		}
		if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("fence: making /etc/%s read-only: %w", name, err)
		}
	}
	return nil
}

// bindTarget is where a bind over path lands: path, or the target of the
// link path is (as a host's /etc/resolv.conf to systemd-resolved's file
// in /run), made as an empty file of root's when it is not there (in the
// server's own /run).
func bindTarget(path string) (string, error) {
	link, err := os.Readlink(path)
	if err != nil {
		return path, nil // not a link
	}
	if !filepath.IsAbs(link) {
		link = filepath.Join(filepath.Dir(path), link)
	}
	if _, err := os.Stat(link); err == nil {
		return link, nil
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return "", fmt.Errorf("fence: %s links to %s: %w", path, link, err)
	}
	f, err := os.OpenFile(link, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return "", fmt.Errorf("fence: %s links to %s: %w", path, link, err)
	}
	return link, f.Close()
}

// loopbackUp sets lo up in the server's fresh network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("fence: reading lo's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("fence: setting lo up: %w", err)
	}
	return nil
}

// dropPrivileges empties the bounding, ambient and inheritable sets,
// becomes spec's user (which empties the permitted and effective sets),
// sets no_new_privs and the parent-death signal, and checks that no
// capability is left. Every setting but the ids is this thread's, the one
// that executes the command.
func dropPrivileges(spec *fenceSpec) error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) && c > 0 {
			break // past the kernel's last capability
		}
		if err != nil {
			return fmt.Errorf("fence: dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("fence: clearing the ambient set: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("fence: clearing the inheritable set: %w", err)
	}
	groups := make([]int, len(spec.Groups))
	for i, g := range spec.Groups {
		groups[i] = int(g)
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("fence: setting the groups: %w", err)
	}
	if err := unix.Setresgid(int(spec.GID), int(spec.GID), int(spec.GID)); err != nil {
		return fmt.Errorf("fence: setting the gid: %w", err)
	}
	if err := unix.Setresuid(int(spec.UID), int(spec.UID), int(spec.UID)); err != nil {
		return fmt.Errorf("fence: setting the uid: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("fence: setting no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("fence: setting the parent-death signal: %w", err)
	}
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return errors.New("fence: capabilities left after the change of user")
		}
	}
	if v, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, 0, 0, 0, 0); err != nil || v != 0 {
		return errors.New("fence: the bounding set is not empty")
	}
	return nil
}
