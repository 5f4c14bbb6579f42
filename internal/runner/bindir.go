package runner

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/state"
)

// The host binaries that every sandbox runs, its init and agentrun-seccomp,
// are bind-mounted from copies in BinDir, not from where they are
// installed. A sandbox's /proc/self/mountinfo names the source of each bind
// mount by its path in the source's file system: bound from /usr/bin or
// from the agentrun binary's directory, it shows that host path; bound from
// a tmpfs of agentrun's own, it shows only /init-<sum>. The tmpfs is
// mounted once for the host, by the first agentrun that needs it, and kept
// (as /run is, until the next boot); each copy is named by its content, so
// that every agentrun of the host, of any version, shares it, and a
// process copies each binary at most once.
//
// A copy's stamp (stamp.go) says which host file, as it was then, it
// copies: the next agentrun process finds the copy by the stamp, from
// the two files' status alone, where it would read, hash and compare both
// binaries again (about a megabyte and a half, a third of a cold run's
// own CPU on a slow host).

// BinDir is the tmpfs the sandboxes' init and agentrun-seccomp are bound
// from.
const BinDir = "/run/agentrun/bin"

// binDirSize bounds BinDir: each copy is under a MiB.
const binDirSize = 64 << 20

// maxBinary bounds a binary copied into BinDir.
const maxBinary = 32 << 20

// staged is this process's copies in BinDir, by the host file they copy.
var staged = struct {
	sync.Mutex
	m map[string]stagedCopy
}{m: map[string]stagedCopy{}}

// stagedCopy is the copy of a host file as the file was when copied.
type stagedCopy struct {
	dev, ino uint64
	size     int64
	mtime    syscall.Timespec
	ctime    syscall.Timespec
	path     string
}

// StageBinary returns the path in BinDir of a copy of the host file bin
// (checked by the caller: the init's checks), as name-<sum of its
// content>, mounting BinDir and copying bin there if need be. The runner
// stages the init; internal/compose a backend's own (libcontainer's
// agentrun-seccomp).
func StageBinary(bin, name string) (string, error) {
	staged.Lock()
	defer staged.Unlock()
	st, err := os.Stat(bin)
	if err != nil {
		return "", err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if sys == nil {
		return "", fmt.Errorf("%s: no stat", bin)
	}
	key := statusOf(sys)
	if c, ok := staged.m[bin]; ok {
		if _, err := os.Lstat(c.path); err == nil && c.sameFile(key) {
			return c.path, nil
		}
	}
	if mounted, err := isTmpfsMount(BinDir); err == nil && mounted {
		if p, ok := stampedCopy(BinDir, bin, name, key); ok {
			key.path = p
			staged.m[bin] = key
			return p, nil
		}
	}
	if err := mountBinDir(BinDir); err != nil {
		return "", err
	}
	key.path, err = copyInto(BinDir, bin, name)
	if err != nil {
		return "", err
	}
	// Without its stamp the next process copies again: not an error.
	_ = writeStamp(BinDir, bin, name, key, key.path)
	staged.m[bin] = key
	return key.path, nil
}

// sameFile reports whether c was copied from the file whose status is f.
func (c stagedCopy) sameFile(f stagedCopy) bool {
	return c.dev == f.dev && c.ino == f.ino && c.size == f.size && c.mtime == f.mtime && c.ctime == f.ctime
}

// mountBinDir mounts a tmpfs at dir, unless one is mounted there: under
// a lock beside it, for the agentruns of the host that start together.
func mountBinDir(dir string) error {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", parent, err)
	}
	lock, err := state.Lock(dir+".lock", unix.LOCK_EX)
	if err != nil {
		return fmt.Errorf("locking %s: %w", dir, err)
	}
	defer lock.Close()
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	mounted, err := isTmpfsMount(dir)
	if err != nil || mounted {
		return err
	}
	opts := fmt.Sprintf("size=%d,mode=0755,uid=0,gid=0", binDirSize)
	if err := unix.Mount("agentrun", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting a tmpfs at %s: %w", dir, err)
	}
	return nil
}

// isTmpfsMount reports whether dir is the root of a tmpfs, root's and
// writable by no one else.
func isTmpfsMount(dir string) (bool, error) {
	var fsst unix.Statfs_t
	if err := unix.Statfs(dir, &fsst); err != nil {
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	var d, p unix.Stat_t
	if err := unix.Lstat(dir, &d); err != nil {
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &p); err != nil {
		return false, fmt.Errorf("%s: %w", filepath.Dir(dir), err)
	}
	if d.Mode&unix.S_IFMT != unix.S_IFDIR || d.Uid != 0 || d.Mode&0o022 != 0 {
		return false, fmt.Errorf("%s must be a directory of root's, writable by no one else (mode %o, uid %d)", dir, d.Mode&0o7777, d.Uid)
	}
	return fsst.Type == unix.TMPFS_MAGIC && d.Dev != p.Dev, nil
}

// copyInto copies the host file bin into dir as name-<sum>, mode 0555,
// unless a copy of the same content is there, and returns its path. The
// copy is written aside and renamed into place: an agentrun that finds it
// finds it whole.
func copyInto(dir, bin, name string) (string, error) {
	f, err := os.Open(bin)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := readAtMost(f, bin, maxBinary)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	out := filepath.Join(dir, name+"-"+hex.EncodeToString(sum[:8]))
	if same, err := sameCopy(out, data); err != nil || same {
		return out, err
	}
	err = writeCopy(dir, name, out, data)
	if errors.Is(err, unix.ENOSPC) {
		// Full of the copies of earlier builds: those go (a sandbox that
		// binds one keeps it until it ends; an agentrun that staged one
		// copies it again), and this one is tried again.
		pruneCopies(dir, out)
		err = writeCopy(dir, name, out, data)
	}
	if err != nil {
		return "", fmt.Errorf("copying %s into %s: %w", bin, dir, err)
	}
	return out, nil
}

// pruneCopies removes every file of dir but keep.
func pruneCopies(dir, keep string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if p := filepath.Join(dir, e.Name()); p != keep && e.Type().IsRegular() {
			os.Remove(p)
		}
	}
}

// writeCopy writes data as out, aside first and then renamed into place.
func writeCopy(dir, name, out string, data []byte) error {
	tmp, err := os.CreateTemp(dir, ".tmp-"+name+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	return err
}

// sameCopy reports whether path is a copy of data: a regular file of
// this process's user, mode 0555, of that content. A file of another
// content or mode there is an error, not a copy to replace.
func sameCopy(path string, data []byte) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return false, err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if !st.Mode().IsRegular() || sys == nil || int(sys.Uid) != os.Geteuid() || st.Mode().Perm() != 0o555 || st.Size() != int64(len(data)) {
		return false, fmt.Errorf("%s is not a copy agentrun made (mode %v, size %d)", path, st.Mode(), st.Size())
	}
	got, err := io.ReadAll(io.LimitReader(f, int64(len(data))+1))
	if err != nil {
		return false, err
	}
	if !bytes.Equal(got, data) {
		return false, fmt.Errorf("%s is not a copy agentrun made: its content differs", path)
	}
	return true, nil
}
