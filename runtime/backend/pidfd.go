package backend

import "golang.org/x/sys/unix"

// Exited reports whether the process behind pidfd fd has ended (a pidfd
// is readable from then on, reaped or not), without waiting. No pidfd
// (fd < 0), a closed one or a poll that fails reports it ended: a sandbox
// that cannot be checked is not used.
func Exited(fd int) bool {
	if fd < 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}
