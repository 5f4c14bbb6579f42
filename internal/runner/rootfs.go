package runner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// overlay is a run's private writable view of a shared root filesystem:
// libcontainer creates missing mount points in it (/workspace, /tmp, ...),
// never in the shared lower directory. The container still mounts it
// read-only.
type overlay struct {
	merged string
}

// mountOverlay mounts lower under dir/rootfs with its upper and work
// directories in dir (the run's state dir, a tmpfs).
func mountOverlay(lower, dir string) (*overlay, error) {
	if strings.ContainsAny(lower, ",:\\") {
		return nil, fmt.Errorf("image directory %q: ',', ':' and '\\' are not supported in its path", lower)
	}
	o := &overlay{merged: filepath.Join(dir, "rootfs")}
	for _, d := range []string{"upper", "work", "rootfs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("creating overlay dir: %w", err)
		}
	}
	// The sandbox runs as nobody and must traverse the root.
	if err := os.Chmod(filepath.Join(dir, "upper"), 0o755); err != nil {
		return nil, err
	}
	opts := "lowerdir=" + lower + ",upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
	if err := unix.Mount("overlay", o.merged, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return nil, fmt.Errorf("mounting overlay over %s: %w", lower, err)
	}
	return o, nil
}

func (o *overlay) unmount() error {
	if err := unix.Unmount(o.merged, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmounting run rootfs: %w", err)
	}
	return nil
}
