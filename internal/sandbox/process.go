package sandbox

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/runtime/backend"
)

// Event is one event of a process, as the API streams it.
type Event = runapi.ProcessEvent

// Info is a process as a list shows it.
type Info = runapi.ProcessInfo

// Process is a process of a sandbox: its events, kept up to a bound,
// and its stdin while it is open.
type Process struct {
	pid     int
	argv    []string
	started time.Time
	sp      backend.Spawned

	// pty is the master of its pseudo-terminal, nil without one; it is
	// its stdin too, and closed only once the process ended.
	pty *os.File

	mu    sync.Mutex
	stdin *os.File // nil once closed
	// events holds the start, the output kept and the exit; first is the
	// sequence number of events[0] (older output was dropped).
	events  []Event
	first   int
	kept    int64 // output bytes in events
	limit   int64 // output bytes kept at most
	dropped int64
	exit    *Event
	changed chan struct{} // closed and replaced on every change
	done    chan struct{} // closed once the exit event is in
}

// outputGrace bounds how long a process's exit waits for the rest of its
// output once it has ended: a child it left in the background may hold
// its pipes open.
const outputGrace = 2 * time.Second

// readChunk is the most one output event carries.
const readChunk = 32 << 10

func newProcess(argv []string, limit int64) *Process {
	return &Process{argv: argv, started: time.Now(), limit: limit,
		changed: make(chan struct{}), done: make(chan struct{})}
}

// stream is an output of a process and the name of its events.
type stream struct {
	r    *os.File
	name string
}

// run reads p's outputs, enforces its timeout (0: none) and, once it
// ended, adds its exit event.
func (p *Process) run(timeout time.Duration, outs ...stream) {
	var wg sync.WaitGroup
	for _, o := range outs {
		wg.Go(func() { p.read(o.r, o.name) })
	}
	waited := make(chan *os.ProcessState, 1)
	go func() {
		ps, _ := p.sp.Wait()
		waited <- ps
	}()
	var timedOut bool
	var ps *os.ProcessState
	if timeout > 0 {
		ps, timedOut = backend.Watch(context.Background(), timeout, waited, func() *os.ProcessState {
			_ = p.sp.Signal(unix.SIGKILL)
			return <-waited
		})
	} else {
		ps = <-waited
	}
	dur := time.Since(p.started)
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(outputGrace):
		closeAll(outs)
		<-drained
	}
	closeAll(outs)
	var o backend.Outcome
	o.SetExit(ps, timedOut)
	code := o.ExitCode
	p.mu.Lock()
	p.closeStdinLocked()
	p.exit = &Event{Event: "exit", ExitCode: &code, Signal: o.Signal, TimedOut: o.TimedOut,
		DurationMS: dur.Milliseconds(), Dropped: p.dropped}
	p.appendLocked(*p.exit)
	close(p.done)
	p.mu.Unlock()
}

func closeAll(outs []stream) {
	for _, o := range outs {
		o.r.Close()
	}
}

// read makes events of r's output until it ends: at EOF, at EIO (a
// terminal's master once no process holds its other end), or closed.
func (p *Process) read(r *os.File, stream string) {
	buf := make([]byte, readChunk)
	var pending []byte // an incomplete UTF-8 sequence at a chunk's end
	for {
		n, err := r.Read(buf)
		if n > 0 {
			data := append(pending, buf[:n]...)
			pending = nil
			if cut := incompleteTail(data); cut > 0 && err == nil {
				pending = append([]byte(nil), data[len(data)-cut:]...)
				data = data[:len(data)-cut]
			}
			p.output(stream, data)
		}
		if err != nil {
			if len(pending) > 0 {
				p.output(stream, pending)
			}
			return // EOF, EIO, or closed past outputGrace
		}
	}
}

// incompleteTail is the length of an incomplete UTF-8 sequence that ends
// b (at most 3 bytes), 0 if none.
func incompleteTail(b []byte) int {
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			return 0
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}

func (p *Process) output(stream string, data []byte) {
	ev := Event{Event: stream}
	if utf8.Valid(data) {
		ev.Data = string(data)
	} else {
		ev.DataB64 = base64.StdEncoding.EncodeToString(data)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if int64(len(data)) > p.limit {
		p.dropped += int64(len(data))
		return
	}
	p.appendLocked(ev)
	p.kept += int64(len(data))
	// The oldest events go first (the start's too): what is kept is a
	// tail.
	for p.kept > p.limit {
		n := outputLen(p.events[0])
		p.events = p.events[1:]
		p.first++
		p.kept -= n
		p.dropped += n
	}
}

// outputLen is the output bytes e carries.
func outputLen(e Event) int64 {
	b64 := strings.TrimRight(e.DataB64, "=")
	return int64(len(e.Data) + base64.StdEncoding.WithPadding(base64.NoPadding).DecodedLen(len(b64)))
}

func (p *Process) appendLocked(e Event) {
	p.events = append(p.events, e)
	close(p.changed)
	p.changed = make(chan struct{})
}

// Pid is the process's pid inside the sandbox.
func (p *Process) Pid() int { return p.pid }

// Done is closed once the process's exit event is in.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit is the exit event, nil while it runs.
func (p *Process) Exit() *Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// Next returns the events from sequence number seq on (or from the
// oldest kept, if those were dropped), waiting for one while there is
// none and the process runs, until ctx is done; the next seq to ask
// for; and whether the exit is among those returned.
func (p *Process) Next(ctx context.Context, seq int) ([]Event, int, bool) {
	for {
		p.mu.Lock()
		if seq < p.first {
			seq = p.first
		}
		end := p.first + len(p.events)
		if seq < end {
			evs := append([]Event(nil), p.events[seq-p.first:]...)
			done := p.exit != nil
			p.mu.Unlock()
			return evs, end, done
		}
		if p.exit != nil {
			p.mu.Unlock()
			return nil, seq, true
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, seq, false
		}
	}
}

// WriteStdin writes data to the process's stdin, and closes it after if
// close is set. A terminal's stdin stays open while the process runs:
// close writes the terminal's end of file (Ctrl-D) instead.
func (p *Process) WriteStdin(data []byte, close bool) error {
	if p.pty != nil && close {
		data = append(data[:len(data):len(data)], eot)
		close = false
	}
	p.mu.Lock()
	in := p.stdin
	p.mu.Unlock()
	if in == nil {
		if len(data) == 0 && close {
			return nil
		}
		return errkind.New(errkind.Busy, "the process's stdin is closed")
	}
	if len(data) > 0 {
		// The deadline bounds a write to a process that does not read.
		_ = in.SetWriteDeadline(time.Now().Add(stdinWait))
		if _, err := in.Write(data); err != nil {
			return errkind.Mark(errkind.Timeout, fmt.Errorf("the process did not take its stdin: %w", err))
		}
	}
	if close {
		p.mu.Lock()
		p.closeStdinLocked()
		p.mu.Unlock()
	}
	return nil
}

// stdinWait bounds one write to a process's stdin.
const stdinWait = 10 * time.Second

// eot is a terminal's end of file, as its line discipline has it by
// default (VEOF, Ctrl-D).
const eot = 0x04

func (p *Process) closeStdinLocked() {
	// A terminal's master is its output too: run closes it.
	if p.stdin != nil && p.stdin != p.pty {
		p.stdin.Close()
	}
	p.stdin = nil
}

// Resize sets the size of the process's pseudo-terminal.
func (p *Process) Resize(size runapi.TTYSize) error {
	ws, err := winSize(size)
	if err != nil {
		return err
	}
	if p.pty == nil {
		return errkind.New(errkind.Busy, "the process has no pseudo-terminal")
	}
	select {
	case <-p.done:
		return errkind.New(errkind.Busy, "the process has ended")
	default:
	}
	raw, err := p.pty.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	}); err != nil {
		return errkind.New(errkind.Busy, "the process has ended")
	}
	if ierr != nil {
		return fmt.Errorf("resizing the terminal: %w", ierr)
	}
	return nil
}

// Signal sends sig to the process while it runs.
func (p *Process) Signal(sig unix.Signal) error {
	select {
	case <-p.done:
		return errkind.New(errkind.Busy, "the process has ended")
	default:
	}
	return p.sp.Signal(sig)
}

// record is the process, once it ended, as the audit record lists it.
func (p *Process) record() audit.Process {
	cmd, words := audit.CommandOf(p.argv)
	r := audit.Process{Pid: p.pid, Command: cmd, CommandWords: words, TTY: p.pty != nil, Started: p.started.UTC()}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.exit; e != nil {
		r.ExitCode, r.Signal, r.TimedOut, r.DurationMS = *e.ExitCode, e.Signal, e.TimedOut, e.DurationMS
	}
	return r
}

// Info is the process as a list shows it.
func (p *Process) Info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := Info{Pid: p.pid, Command: p.argv, TTY: p.pty != nil, Started: p.started, Running: p.exit == nil}
	if p.exit != nil {
		in.ExitCode = p.exit.ExitCode
	}
	return in
}
