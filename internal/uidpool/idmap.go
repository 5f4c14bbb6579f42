package uidpool

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Remap replaces the mount at dir by an id-mapped copy of it on which the
// files that the file system stores as owned by uid and gid from appear
// owned by to, and files the program there creates as to are stored as
// from. So a kept session's disk keeps one owner (from) whatever id each
// of its runs has. Files of any other owner but root appear as nobody
// (65534) and cannot be changed through dir. The mount's flags stay as they were.
//
// Root keeps its id through dir (runsc's gofer creates files as root and
// then gives them to the program). It needs Linux 5.12 and a file
// system that supports id-mapped mounts (ext4, tmpfs since 6.3).
func Remap(dir string, from, to uint32) error {
	return remap(dir, dir, from, to, 0)
}

// RemapOnto is Remap of the mount at src, whose id-mapped copy is mounted
// on dst instead (on what is mounted there, which stays under it), with
// attrs (MOUNT_ATTR_NOEXEC and the others) set on it as well; src is then
// unmounted. A mount made on dst propagates as dst's peers and slaves get
// it: it is how a prepared sandbox, whose /workspace is a slave of dst,
// gets a kept session's disk.
// The id map is ns, a user namespace from IDMap(from, to), made ahead:
// making one starts a process, which a run that takes a prepared sandbox
// should not wait for.
func RemapOnto(src, dst string, ns *os.File, attrs uint64) error {
	return remapWith(src, dst, ns, attrs)
}

// IDMap returns a user namespace, open, that maps from (as uid and gid)
// to host id to, and root to root: the id map of Remap, for RemapOnto.
func IDMap(from, to uint32) (*os.File, error) { return userns(from, to) }

// remap mounts an id-mapped copy of the mount at src, with attrs set, on
// dst, and unmounts src; src and dst may be one.
func remap(src, dst string, from, to uint32, attrs uint64) error {
	ns, err := userns(from, to)
	if err != nil {
		return err
	}
	defer ns.Close()
	return remapWith(src, dst, ns, attrs)
}

// remapWith is remap with the id map of user namespace ns.
func remapWith(src, dst string, ns *os.File, attrs uint64) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("id-mapping %s: open_tree: %w", src, err)
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_IDMAP | attrs, Userns_fd: uint64(ns.Fd()),
	}); err != nil {
		return fmt.Errorf("id-mapping %s (needs Linux 5.12 and a file system that supports id-mapped mounts): %w", src, err)
	}
	if err := unix.Unmount(src, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("id-mapping %s: unmounting the original: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("id-mapping %s: move_mount onto %s: %w", src, dst, err)
	}
	return nil
}

// userns returns a user namespace, open, that maps from (as uid and gid)
// to host id to, and root to root. A process has to make it: a child cloned
// into it and stopped by ptrace at its exec, before it runs anything (as
// libcontainer makes the namespaces of its id-mapped mounts); the child is
// killed once the namespace is open.
func userns(from, to uint32) (*os.File, error) {
	// Root stays root: runsc's gofer creates a file as root, then gives
	// it to the program's uid.
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: int(from), HostID: int(to), Size: 1}}
	proc, err := os.StartProcess("/proc/self/exe", []string{"agentrun-idmap"}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER,
			UidMappings: m,
			GidMappings: m,
			Ptrace:      true,
			Pdeathsig:   syscall.SIGKILL,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("making the user namespace of an id-mapped mount: %w", err)
	}
	defer func() {
		_ = proc.Kill()
		_, _ = proc.Wait()
	}()
	f, err := os.Open("/proc/" + strconv.Itoa(proc.Pid) + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("opening the user namespace of an id-mapped mount: %w", err)
	}
	return f, nil
}
