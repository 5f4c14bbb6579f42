package session

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountFlags: a session's files are data, never programs or devices.
const mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME

// mountOpts: deleted files give their space back to the host (discard
// punches holes in the sparse image); the inode tables are never zeroed
// in the background.
const mountOpts = "errors=remount-ro,discard,noinit_itable"

// mountImage attaches img to a free loop device with autoclear and mounts
// it at dir (created 0700). The loop device is detached by the kernel when
// the mount goes (or at once when this fails or the process dies first).
func mountImage(img, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating session mount point: %w", err)
	}
	dev, err := attach(img)
	if err != nil {
		os.Remove(dir)
		return err
	}
	defer dev.Close()
	if err := unix.Mount(dev.Name(), dir, "ext4", mountFlags, mountOpts); err != nil {
		os.Remove(dir)
		return fmt.Errorf("mounting session disk: %w", err)
	}
	return nil
}

// attach binds img to a free loop device and returns it open; closing it
// without a mount detaches it.
func attach(img string) (*os.File, error) {
	backing, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("opening session disk: %w", err)
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening loop control: %w", err)
	}
	defer ctl.Close()
	// Another process may take the free device first: try again.
	for try := 0; try < 16; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("finding a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], img)
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configuring loop device: %w", err)
		}
	}
	return nil, errors.New("configuring loop device: no free device after 16 tries")
}

// unmount unmounts dir and removes it. A mount still in use (which should
// not happen: the run's processes are gone) is detached lazily.
func unmount(dir string) error {
	if err := unix.Unmount(dir, 0); err != nil {
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmounting session disk: %w", err)
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting session disk: %w", err)
		}
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("removing session mount point: %w", err)
	}
	return nil
}

// clearMountPoint removes what a process killed in mountImage or before
// unmount left at dir, a session's mount point: a mount (detached, with
// its loop device) and the directory itself. The caller holds the
// session's lock, so nothing at dir is in use. A directory that holds
// anything once unmounted was not made by mountImage: it is left, and its
// removal fails, never deleting more than an empty directory.
func clearMountPoint(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := UnmountUnder(dir); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing a stale session mount point: %w", err)
	}
	return nil
}

// attached reports whether a loop device is backed by img.
func attached(img string) bool {
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if f, err := os.ReadFile(b); err == nil && strings.TrimSuffix(string(f), "\n") == img {
			return true
		}
	}
	return false
}
