// Package cachefile keeps agentrun's caches of derived bytes (a compiled
// seccomp program, the run launcher's bytecode) as files of root's in a
// directory of root's: each written whole or not at all, and read back
// only from a regular file that root owns and no one else may read or
// write, within a stated size.
package cachefile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// tmpPrefix opens the names of files being written.
const tmpPrefix = ".tmp-"

// Read reads the cache file at path: a regular file (not a symlink) of
// root's, mode 0600 or narrower, of at most max bytes.
func Read(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.Mode().IsRegular() || st.Uid != 0 || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is not a cache file of root's alone", path)
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes, more than the %d of its kind", path, fi.Size(), max)
	}
	// One buffer of the size the file has, and room to see it grow, not
	// io.ReadAll's doubling ones: a one-shot run reads a compiled filter
	// and the launcher's bytecode, and every byte it allocates is a fresh
	// page of its heap.
	buf := bytes.NewBuffer(make([]byte, 0, fi.Size()+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(f, max+1)); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s grew past %d bytes as it was read", path, max)
	}
	return b, nil
}

// Write writes data as dir/name (dir made, 0700), mode 0600, whole or not
// at all.
func Write(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, tmpPrefix)
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	return nil
}

// Temporary reports whether name is that of a file Write was writing.
func Temporary(name string) bool {
	return len(name) >= len(tmpPrefix) && name[:len(tmpPrefix)] == tmpPrefix
}
