package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Mount points every rootfs gets before it is published, so that runs
// mount over them and never have to create anything in the shared tree.
var (
	mountDirs  = []string{"proc", "sys", "dev", "tmp", "workspace"}
	mountFiles = []string{"etc/resolv.conf", "etc/hosts"}
)

// PrepareMountpoints makes /proc /sys /dev /tmp /workspace real
// directories (mode 0755) and /etc/resolv.conf and /etc/hosts empty
// regular files (0644), replacing any symlink or other file there.
func PrepareMountpoints(root *os.Root) error {
	asRoot := os.Geteuid() == 0
	for _, d := range mountDirs {
		fi, err := root.Lstat(d)
		if err == nil && !fi.IsDir() {
			if err := root.RemoveAll(d); err != nil {
				return fmt.Errorf("preparing mount point /%s: %w", d, err)
			}
			err = fs.ErrNotExist
		}
		if errors.Is(err, fs.ErrNotExist) {
			err = root.Mkdir(d, 0o755)
		}
		if err == nil {
			err = root.Chmod(d, 0o755)
		}
		if err == nil && asRoot {
			err = root.Lchown(d, 0, 0)
		}
		if err != nil {
			return fmt.Errorf("preparing mount point /%s: %w", d, err)
		}
	}
	fi, err := root.Lstat("etc")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := root.Mkdir("etc", 0o755); err != nil {
			return fmt.Errorf("preparing /etc: %w", err)
		}
		if err := root.Chmod("etc", 0o755); err != nil {
			return fmt.Errorf("preparing /etc: %w", err)
		}
	case err != nil:
		return fmt.Errorf("preparing /etc: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("preparing /etc: image's /etc is %v, not a directory", fi.Mode().Type())
	}
	for _, name := range mountFiles {
		if err := root.RemoveAll(name); err != nil {
			return fmt.Errorf("preparing mount point /%s: %w", name, err)
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("preparing mount point /%s: %w", name, err)
		}
		err = f.Chmod(0o644)
		if err == nil && asRoot {
			err = f.Chown(0, 0)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("preparing mount point /%s: %w", name, err)
		}
	}
	return nil
}

// HasMountpoints reports whether rootfs has the mount points
// PrepareMountpoints makes, with the right file types.
func HasMountpoints(rootfs string) bool {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return false
	}
	defer root.Close()
	for _, d := range mountDirs {
		if fi, err := root.Lstat(d); err != nil || !fi.IsDir() {
			return false
		}
	}
	if fi, err := root.Lstat("etc"); err != nil || !fi.IsDir() {
		return false
	}
	for _, f := range mountFiles {
		if fi, err := root.Lstat(filepath.FromSlash(f)); err != nil || !fi.Mode().IsRegular() {
			return false
		}
	}
	return true
}
