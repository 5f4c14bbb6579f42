package backend

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PTYMaster checks that f, received from a runtime over its console
// socket, is a pseudo-terminal's master, and returns a non-blocking
// duplicate of it (its reads and writes go through Go's poller:
// deadlines, and a Close that ends a read). f stays the caller's to close.
func PTYMaster(f *os.File) (*os.File, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var cerr error
	if err := raw.Control(func(r uintptr) {
		if _, cerr = unix.IoctlGetUint32(int(r), unix.TIOCGPTN); cerr != nil {
			cerr = fmt.Errorf("what was sent is not a pseudo-terminal's master: %w", cerr)
			return
		}
		fd, cerr = unix.FcntlInt(r, unix.F_DUPFD_CLOEXEC, 3)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, cerr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "pty"), nil
}
