package runner

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// SandboxUser is the name the sandbox's own uid and gid have inside it.
const SandboxUser = "sandbox"

// IdentityEntry is a line identity adds for the sandbox's uid to the
// image's etc file Name.
type IdentityEntry struct{ Name, Entry string }

// IdentityEntries are the lines identity adds for uid (which is also the
// sandbox's gid) to the image's /etc/passwd and /etc/group; the bench
// writes runc's bundle with the same.
func IdentityEntries(uid int) []IdentityEntry {
	return []IdentityEntry{
		{"passwd", fmt.Sprintf("%s:x:%d:%d:agentrun sandbox:/tmp:/usr/sbin/nologin\n", SandboxUser, uid, uid)},
		{"group", fmt.Sprintf("%s:x:%d:\n", SandboxUser, uid)},
	}
}

// maxIdentityBytes bounds the image's /etc/passwd and /etc/group, read
// for each run.
const maxIdentityBytes = 1 << 20

// identity gives the sandbox's own uid and gid a name: it writes the
// image's /etc/passwd and /etc/group, each with a SandboxUser entry for
// uid added, into the run's etc tmpfs in dir (writeEtc), and returns the
// spec options that mount them read-only over the image's. Programs that
// look their user up (getpwuid: whoami, git, ssh, getpass) then find it,
// though each run has a uid of its own. A file the image lacks, or has as
// anything but a regular file, is left as it is (nothing is ever created
// in the shared rootfs). The image is read through os.Root: a symlink
// never leads out of it.
func identity(rootfs, dir string, uid int, undo *cleanup.Cleanup) ([]spec.SpecOpt, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening the run's rootfs: %w", err)
	}
	defer root.Close()
	var opts []spec.SpecOpt
	for _, f := range IdentityEntries(uid) {
		in := "etc/" + f.Name
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
		out, err := writeEtc(dir, undo, f.Name, append(data, f.Entry...))
		if err != nil {
			return nil, fmt.Errorf("writing the sandbox's /%s: %w", in, err)
		}
		opts = append(opts, spec.WithReadonlyFile(out, "/"+in))
	}
	return opts, nil
}

// maxEtcBytes bounds a run's etc tmpfs: its passwd and group (each at
// most maxIdentityBytes), the bundle of the image's roots (at most
// maxBundleBytes) with the run's CA, and, in the room left, the CA alone,
// resolv.conf, hosts, the added entries and tmpfs's rounding to pages.
const maxEtcBytes = 2*maxIdentityBytes + maxBundleBytes + 1<<20

// writeEtc writes data as name (a path in the run's etc tmpfs; its parent
// directories are made) and returns its host path. The etc tmpfs, at
// dir/etc, holds what the sandbox is shown read-only over the image's or
// beside it: passwd and group, resolv.conf and hosts, the run's CA and the
// bundle with it. Bind-mounted from a tmpfs of its own, a file is named in
// the sandbox's mountinfo by its path in that tmpfs, never by a host path.
// The first write mounts it, sized maxEtcBytes, and pushes its unmount on
// undo.
func writeEtc(dir string, undo *cleanup.Cleanup, name string, data []byte) (string, error) {
	etc := filepath.Join(dir, "etc")
	if _, err := os.Lstat(etc); errors.Is(err, fs.ErrNotExist) {
		if err := mountEtc(etc, undo); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("the run's etc tmpfs: %w", err)
	}
	out := filepath.Join(etc, name)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return "", err
	}
	return out, nil
}

// mountEtc mounts a tmpfs of maxEtcBytes at etc (created), and pushes its
// unmount on undo.
func mountEtc(etc string, undo *cleanup.Cleanup) error {
	if err := os.Mkdir(etc, 0o755); err != nil {
		return fmt.Errorf("creating the run's etc tmpfs: %w", err)
	}
	opts := fmt.Sprintf("size=%d,mode=0755", maxEtcBytes)
	if err := unix.Mount("tmpfs", etc, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting the run's etc tmpfs: %w", err)
	}
	undo.Add(func() error {
		if err := unix.Unmount(etc, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting the run's etc tmpfs: %w", err)
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
