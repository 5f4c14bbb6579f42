package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CopyMode is how a fork copies a session's files on the store's file
// system.
type CopyMode string

// The copy modes.
const (
	// Reflink: the copies share the source's blocks (FICLONE, on btrfs
	// and XFS): a fork costs about the same at any size and count.
	Reflink CopyMode = "reflink"
	// Copy: the files' data extents are copied (SEEK_DATA, SEEK_HOLE and
	// copy_file_range), so a sparse disk costs what it holds.
	Copy CopyMode = "copy"
)

// CopyMode is how a fork copies on this store: Reflink where its file
// system clones a file (tried on two unnamed files of its own, O_TMPFILE,
// which leave nothing behind), else Copy.
func (s *Store) CopyMode() CopyMode {
	if canClone(s.dir) {
		return Reflink
	}
	return Copy
}

// canClone reports whether the file system of dir clones a file.
func canClone(dir string) bool {
	open := func() (*os.File, error) {
		fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, err
		}
		return os.NewFile(uintptr(fd), "clone probe"), nil
	}
	src, err := open()
	if err != nil {
		return false
	}
	defer src.Close()
	dst, err := open()
	if err != nil {
		return false
	}
	defer dst.Close()
	if _, err := src.Write(make([]byte, 4096)); err != nil {
		return false
	}
	return unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil
}

// copyFiles copies the files names of directory from into directory to,
// by mode, and returns the bytes it copied. Running out of room is
// ErrNoRoom.
func copyFiles(ctx context.Context, from, to string, names []string, mode CopyMode) (int64, error) {
	var copied int64
	for _, name := range names {
		n, err := copyFile(ctx, filepath.Join(from, name), filepath.Join(to, name), mode)
		copied += n
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			err = fmt.Errorf("%w: %w", ErrNoRoom, err)
		}
		if err != nil {
			return copied, fmt.Errorf("%s: %w", name, err)
		}
	}
	return copied, nil
}

// copyFile makes dst (which must not exist) a copy of the regular file src,
// with its permissions: a clone where mode is Reflink and the clone
// succeeds, else a copy of its data extents. It returns the bytes copied.
func copyFile(ctx context.Context, src, dst string, mode CopyMode) (_ int64, err error) {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("not a regular file")
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, fi.Mode().Perm())
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if mode == Reflink && unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return 0, nil
	}
	return copyExtents(ctx, in, out, fi.Size())
}

// copyExtents copies the data extents of in (size bytes) to the same
// offsets of the empty file out, leaving its holes holes, and returns the
// bytes copied. ctx is checked between chunks of at most copyChunk bytes.
func copyExtents(ctx context.Context, in, out *os.File, size int64) (int64, error) {
	var copied int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return copied, fmt.Errorf("finding data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return copied, fmt.Errorf("finding a hole: %w", err)
		}
		hole = min(hole, size)
		for at := data; at < hole; {
			if err := ctx.Err(); err != nil {
				return copied, err
			}
			n, err := copyRange(in, out, at, min(hole-at, copyChunk))
			copied += n
			at += n
			if err != nil {
				return copied, err
			}
			if n == 0 {
				return copied, fmt.Errorf("copying at %d: %w", at, io.ErrUnexpectedEOF)
			}
		}
		off = hole
	}
	if err := out.Truncate(size); err != nil {
		return copied, fmt.Errorf("sizing the copy: %w", err)
	}
	return copied, nil
}

// copyChunk is the most bytes copyRange copies between two checks of ctx.
const copyChunk = 64 << 20

// copyRange copies n bytes at off of in to off of out: in the kernel
// (copy_file_range), else through a buffer where the file systems cannot.
func copyRange(in, out *os.File, off, n int64) (int64, error) {
	roff, woff := off, off
	c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(n), 0)
	if err == nil {
		return int64(c), nil
	}
	if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) {
		return 0, fmt.Errorf("copying: %w", err)
	}
	w, err := io.CopyBuffer(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n), make([]byte, 1<<20))
	if err != nil {
		return w, fmt.Errorf("copying: %w", err)
	}
	return w, nil
}
