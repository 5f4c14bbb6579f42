package backend

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Pipes are the three pipes between agentrun and a sandboxed program. The
// child ends (InR, OutW, ErrW) go to the program; agentrun keeps the others.
type Pipes struct {
	InR, InW, OutR, OutW, ErrR, ErrW *os.File
}

// NewPipes makes the program's stdin, stdout and stderr pipes.
func NewPipes() (*Pipes, error) {
	var p Pipes
	var err error
	if p.InR, p.InW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	if p.OutR, p.OutW, err = os.Pipe(); err != nil {
		p.CloseAll()
		return nil, fmt.Errorf("creating stdout pipe: %w", err)
	}
	if p.ErrR, p.ErrW, err = os.Pipe(); err != nil {
		p.CloseAll()
		return nil, fmt.Errorf("creating stderr pipe: %w", err)
	}
	return &p, nil
}

// CloseChildEnds closes agentrun's copies of the ends the program holds once
// it is started, so that the output pipes reach EOF when its side is gone.
func (p *Pipes) CloseChildEnds() { closeFiles(p.InR, p.OutW, p.ErrW) }

// CloseAll closes every end still open; closing twice is harmless.
func (p *Pipes) CloseAll() { closeFiles(p.InR, p.InW, p.OutR, p.OutW, p.ErrR, p.ErrW) }

func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// Serve starts feeding stdin to the program and capturing its stdout and
// stderr (each kept up to limit) once it has started and CloseChildEnds
// was called. The returned wait blocks until both outputs reached EOF,
// which is when every process holding them is gone.
func (p *Pipes) Serve(stdin []byte, limit int64, sink OutputFunc) (wait func() (stdout, stderr Output)) {
	var out, errOut Output
	var wg sync.WaitGroup
	wg.Go(func() { out = Capture(p.OutR, limit, "stdout", sink) })
	wg.Go(func() { errOut = Capture(p.ErrR, limit, "stderr", sink) })
	go Feed(p.InW, stdin) // ends with EPIPE at the latest when the sandbox dies
	return func() (Output, Output) {
		wg.Wait()
		return out, errOut
	}
}

// Feed writes data to the program's stdin and closes it. A program that
// exits without reading makes the write fail with EPIPE, which ends Feed.
func Feed(w *os.File, data []byte) {
	defer w.Close()
	if len(data) > 0 {
		_, _ = w.Write(data)
	}
}

// SocketOutputs replaces the stdout and stderr pipes by stream socket
// pairs: gVisor writes to a host pipe without waiting for room, so a
// program's write of more than the pipe's 64 KiB lost the rest; it waits
// on a socket as it should (Traits.SocketOutputs).
func (p *Pipes) SocketOutputs() error {
	for _, pair := range []struct{ r, w **os.File }{{&p.OutR, &p.OutW}, {&p.ErrR, &p.ErrW}} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("creating output socket pair: %w", err)
		}
		(*pair.r).Close()
		(*pair.w).Close()
		*pair.r, *pair.w = os.NewFile(uintptr(fds[0]), "output-r"), os.NewFile(uintptr(fds[1]), "output-w")
		unix.Shutdown(fds[0], unix.SHUT_WR)
	}
	return nil
}
