package runner

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// SandboxUser is the name the sandbox's own uid and gid have inside it.
const SandboxUser = "sandbox"

// maxIdentityBytes bounds the image's /etc/passwd and /etc/group, read
// for each run.
const maxIdentityBytes = 1 << 20

// identity gives the sandbox's own uid and gid a name: it writes the
// image's /etc/passwd and /etc/group, each with a SandboxUser entry for
// uid added, into dir, and returns the spec options that mount them
// read-only over the image's. Programs that look their user up (getpwuid:
// whoami, git, ssh, getpass) then find it, though each run has a uid of
// its own. A file the image lacks, or has as anything but a regular file,
// is left as it is (nothing is ever created in the shared rootfs). The
// image is read through os.Root: a symlink never leads out of it. The
// files are written in a small tmpfs of their own in the run dir (its
// unmount pushed on undo), so that the sandbox's mountinfo names no host
// path as their source.
func identity(rootfs, dir string, uid int, undo *cleanup.Cleanup) ([]spec.SpecOpt, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening the run's rootfs: %w", err)
	}
	defer root.Close()
	etc := filepath.Join(dir, "etc")
	mounted := false
	var opts []spec.SpecOpt
	for _, f := range []struct{ name, entry string }{
		{"passwd", fmt.Sprintf("%s:x:%d:%d:agentrun sandbox:/tmp:/usr/sbin/nologin\n", SandboxUser, uid, uid)},
		{"group", fmt.Sprintf("%s:x:%d:\n", SandboxUser, uid)},
	} {
		in := "etc/" + f.name
		if fi, err := root.Lstat(in); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		data, err := readImageFile(root, in, maxIdentityBytes)
		if err != nil {
			return nil, err
		}
		if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
			data = append(data, '\n')
		}
		if !mounted {
			if err := mountTmpfs(etc, 2*maxIdentityBytes+2<<16, "the sandbox's identity files", undo); err != nil {
				return nil, err
			}
			mounted = true
		}
		out := filepath.Join(etc, f.name)
		if err := os.WriteFile(out, append(data, f.entry...), 0o644); err != nil {
			return nil, fmt.Errorf("writing the sandbox's /%s: %w", in, err)
		}
		opts = append(opts, spec.WithReadonlyFile(out, "/"+in))
	}
	return opts, nil
}

// mountTmpfs mounts a tmpfs of size bytes at dir (created) for the files
// called what, and pushes its unmount on undo. Files a run's spec mounts
// into the sandbox are written in one, so that its mountinfo names no
// host path as their source.
func mountTmpfs(dir string, size int64, what string, undo *cleanup.Cleanup) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", what, err)
	}
	opts := fmt.Sprintf("size=%d,mode=0755", size)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting %s: %w", what, err)
	}
	undo.Add(func() error {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", what, err)
		}
		return nil
	})
	return nil
}

// readImageFile reads name in the image's root, refusing more than max
// bytes.
func readImageFile(root *os.Root, name string, max int) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, fmt.Errorf("reading the image's /%s: %w", name, err)
	}
	defer f.Close()
	return readAtMost(f, "the image's /"+name, int64(max))
}

// readAtMost reads r, called what in errors, refusing more than max bytes.
func readAtMost(r io.Reader, what string, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", what, max)
	}
	return data, nil
}
