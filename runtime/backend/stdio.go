package backend

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

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

// LockCgroupParent takes a lock, in stateDir, that makes creating a run's
// cgroup and removing the empty shared parent cgroup mutually exclusive,
// across processes: shared while creating (waits), exclusive while removing.
// The exclusive lock is tried for up to removeWait and then given up: a run
// being created holds it, and that run removes the parent when it ends.
// The returned function releases it.
func LockCgroupParent(stateDir string, exclusive bool) (func(), error) {
	f, err := os.OpenFile(stateDir+"/cgroup.lock", os.O_RDONLY|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup lock: %w", err)
	}
	if !exclusive {
		err = unix.Flock(int(f.Fd()), unix.LOCK_SH)
	} else {
		// Another run's removal holds it only briefly; waiting for it
		// matters: two runs ending together would otherwise both give up
		// and leave the parent behind.
		for delay, deadline := time.Millisecond, time.Now().Add(removeWait); ; delay *= 2 {
			if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK || time.Now().After(deadline) {
				break
			}
			time.Sleep(delay)
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking cgroup parent: %w", err)
	}
	return func() { f.Close() }, nil
}

// removeWait bounds how long removing the shared parent cgroup waits for
// its lock.
const removeWait = 250 * time.Millisecond

// StateIDs lists the names of the directories in stateDir that valid
// accepts: the runs a backend keeps state for. A missing stateDir holds none.
func StateIDs(stateDir string, valid func(string) bool) ([]string, error) {
	entries, err := os.ReadDir(stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && valid(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
