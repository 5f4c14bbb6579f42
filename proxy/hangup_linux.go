package proxy

import (
	"context"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// untilHangup returns a context that ends with ctx or, with cause
// errHungUp, as soon as the client at the other end of c hangs up (its
// FIN or reset arrives): whatever path the request came by (plain HTTP,
// transparent, CONNECT with TLS inside), the socket is the client's. It
// never reads from c: bytes the client sent and nobody read yet (the
// rest of a body, a next request) stay for whoever reads c, and the
// hangup is seen past them. It watches a duplicate of c's descriptor,
// so that neither its deadlines nor another reader's are touched. stop
// ends the watch and waits for it; call it once done.
//
// A c that is not a socket (a test's pipe) is not watched.
func untilHangup(ctx context.Context, c net.Conn) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	f := dupConn(c)
	if f == nil {
		return hctx, func() { cancel(nil) }
	}
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return hctx, func() { cancel(nil) }
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Read waits in the runtime's poller for the descriptor to be
		// readable (data, FIN or reset) and asks again until hungUp
		// says so, or f is closed.
		if err := raw.Read(hungUp); err == nil {
			cancel(errHungUp)
		}
	}()
	closeOnEnd := context.AfterFunc(hctx, func() { f.Close() })
	return hctx, func() {
		cancel(nil)
		closeOnEnd()
		f.Close()
		<-done
	}
}

// dupConn is a non-blocking duplicate of c's socket as an *os.File in the
// runtime's poller, or nil.
func dupConn(c net.Conn) *os.File {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	fd := -1
	if err := raw.Control(func(s uintptr) {
		fd, _ = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil || fd < 0 {
		return nil
	}
	return os.NewFile(uintptr(fd), "client")
}

// hungUp reports whether the peer of socket fd has shut down its side
// or reset it, without reading.
func hungUp(fd uintptr) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(p, 0)
	if err != nil {
		return false
	}
	return n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}
