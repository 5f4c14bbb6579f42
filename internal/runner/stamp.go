package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A copy's stamp in BinDir says which host file, as it was when copied
// (device, inode, size, modification and change times), the copy is,
// and what the copy's own status was when the stamp was written. A
// process that finds a stamp whose host file and copy both still have
// that status uses the copy without reading either: a file changed in
// place, or replaced, has another status (the kernel sets its change
// time), and so has a copy written or chmodded since. Anything else (no
// stamp, one of another owner, mode or form, a copy gone) is a miss, and
// the copy is checked byte by byte and stamped again (copyInto).

// maxStamp bounds a stamp's size.
const maxStamp = 4 << 10

// stampPath is the stamp of host file bin's copy named name in dir.
func stampPath(dir, bin, name string) string {
	sum := sha256.Sum256([]byte(bin))
	return filepath.Join(dir, ".stamp-"+name+"-"+hex.EncodeToString(sum[:8]))
}

// statusFields are a file's status as a stamp writes it.
func statusFields(c stagedCopy) []int64 {
	return []int64{int64(c.dev), int64(c.ino), c.size, c.mtime.Sec, c.mtime.Nsec, c.ctime.Sec, c.ctime.Nsec}
}

// statusOf is st's status as a stagedCopy.
func statusOf(st *syscall.Stat_t) stagedCopy {
	return stagedCopy{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// writeStamp stamps copy, dir's copy of host file bin whose status was
// host, written aside and renamed into place.
func writeStamp(dir, bin, name string, host stagedCopy, copy string) error {
	var st syscall.Stat_t
	if err := syscall.Lstat(copy, &st); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString(filepath.Base(copy))
	for _, v := range append(statusFields(host), statusFields(statusOf(&st))...) {
		b.WriteString(" " + strconv.FormatInt(v, 10))
	}
	b.WriteString(" " + bin + "\n")
	tmp, err := os.CreateTemp(dir, ".tmp-stamp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(b.String())
	if err == nil {
		err = tmp.Chmod(0o444)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), stampPath(dir, bin, name))
	}
	return err
}

// stampedCopy is the path of dir's copy of host file bin, whose status
// is host, if a stamp says so and the copy is as stamped.
func stampedCopy(dir, bin, name string, host stagedCopy) (string, bool) {
	line, err := readStamp(stampPath(dir, bin, name))
	if err != nil {
		return "", false
	}
	f := strings.SplitN(strings.TrimSuffix(line, "\n"), " ", 16)
	if len(f) != 16 || f[15] != bin || !isCopyName(f[0], name) {
		return "", false
	}
	var v [14]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return "", false
		}
	}
	if [7]int64(v[:7]) != [7]int64(statusFields(host)) {
		return "", false
	}
	copy := filepath.Join(dir, f[0])
	var st syscall.Stat_t
	if err := syscall.Lstat(copy, &st); err != nil {
		return "", false
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o7777 != 0o555 || st.Size != host.size ||
		[7]int64(v[7:]) != [7]int64(statusFields(statusOf(&st))) {
		return "", false
	}
	return copy, true
}

// readStamp reads a stamp: a regular file of this process's user, mode
// 0444, never through a link, at most maxStamp bytes.
func readStamp(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if !st.Mode().IsRegular() || sys == nil || int(sys.Uid) != os.Geteuid() || st.Mode().Perm() != 0o444 || st.Size() > maxStamp {
		return "", errors.New("not a stamp agentrun wrote")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxStamp+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxStamp {
		return "", fmt.Errorf("%s: larger than %d bytes", path, maxStamp)
	}
	return string(b), nil
}

// isCopyName reports whether s names a copy of name: name-<16 hex>.
func isCopyName(s, name string) bool {
	sum, ok := strings.CutPrefix(s, name+"-")
	if !ok || len(sum) != 16 {
		return false
	}
	_, err := hex.DecodeString(sum)
	return err == nil
}
