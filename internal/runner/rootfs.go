package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime/spec"
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
	// The layers are named by descriptors (/proc/self/fd/N): overlayfs shows
	// its options as given in mountinfo, which the sandbox reads, and they
	// then name no host path of the image or the run.
	var opts []string
	for _, l := range []struct{ opt, path string }{
		{"lowerdir", lower}, {"upperdir", filepath.Join(dir, "upper")}, {"workdir", filepath.Join(dir, "work")},
	} {
		f, err := os.OpenFile(l.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening overlay %s: %w", l.opt, err)
		}
		defer f.Close()
		opts = append(opts, fmt.Sprintf("%s=/proc/self/fd/%d", l.opt, f.Fd()))
	}
	if err := unix.Mount("overlay", o.merged, "overlay", unix.MS_NODEV|unix.MS_NOSUID, strings.Join(opts, ",")); err != nil {
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

// checkProgram fails, naming the program, when argv0 is certainly not in
// rootfs: a name without a slash is looked up in the sandbox's PATH. The
// init would otherwise start, fail to exec it and exit 127, which reads as
// the program's own status. Only a clean "does not exist" counts: a path
// through an absolute symlink (which os.Root will not follow) or under
// one of the sandbox's own mounts is left to the exec.
func checkProgram(rootfs, argv0 string) error {
	var cands []string
	switch {
	case strings.HasPrefix(argv0, "/"):
		cands = []string{argv0}
	case strings.Contains(argv0, "/"):
		return nil // relative to /workspace, which is noexec anyway
	default:
		for _, dir := range filepath.SplitList(spec.DefaultPath) {
			cands = append(cands, dir+"/"+argv0)
		}
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("opening the image root: %w", err)
	}
	defer root.Close()
	for _, c := range cands {
		top, _, _ := strings.Cut(strings.TrimPrefix(c, "/"), "/")
		switch top {
		case "dev", "proc", "sys", "tmp", "workspace":
			return nil
		}
		if _, err := root.Stat(strings.TrimPrefix(c, "/")); !errors.Is(err, fs.ErrNotExist) {
			return nil
		}
	}
	if len(cands) == 1 {
		return fmt.Errorf("program %s: no such file in the image", argv0)
	}
	return fmt.Errorf("program %q: not found in the image's PATH (%s)", argv0, spec.DefaultPath)
}
