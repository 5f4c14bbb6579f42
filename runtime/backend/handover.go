package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/untrusted"
)

// Handover is the control channel of a sandbox whose program is started
// as the sandbox is prepared and waits there for its run: a warm
// sandbox's launcher, or the start of a pooled sandbox's program
// (runtime/runc: agentrun-seccomp --handover, which then executes the
// program). It is a socket pair, one end agentrun's, the other passed to
// the program.
// The program says once that it is ready (or why it failed); at the run's
// start agentrun says "go", the program acknowledges, agentrun closes its
// end, and the program, having read that close, closes its own before it
// goes on. After a failed hand-over agentrun's end is closed only once the
// sandbox is killed, so the program never goes on. Nothing is ever read
// from the channel after the hand-over: what the program writes to it
// later reaches no one.
//
// Every message is a line of at most handoverLine bytes; anything else
// from the program (it runs image code) is a failure, never trusted.
type Handover struct {
	conn  *os.File // agentrun's end: non-blocking, close-on-exec
	child *os.File // the program's end, until the backend has passed it on
	// program names what waits on the other end, in errors.
	program string
}

// FDArg, as an argument of a waiting program's argv, is replaced by the
// number of the descriptor at which the program gets its end (Child).
const FDArg = "{handover-fd}"

// handoverLine bounds one message of the channel.
const handoverLine = 1024

// NewHandover makes the channel to program, which errors name: "warm
// program" (a warm sandbox's launcher), "program's start" (the start a
// pooled sandbox's program waits in).
func NewHandover(program string) (*Handover, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating the hand-over socket pair: %w", err)
	}
	// agentrun's end polls (deadlines); the program's end blocks.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("hand-over socket: %w", err)
	}
	return &Handover{conn: os.NewFile(uintptr(fds[0]), "handover"), child: os.NewFile(uintptr(fds[1]), "handover-child"), program: program}, nil
}

// Child is the program's end, for the backend to pass at descriptor fd,
// and args, the argv the container starts with, with fd in place of
// FDArg.
func (h *Handover) Child(fd int, args []string) (*os.File, []string) {
	argv := make([]string, len(args))
	for i, a := range args {
		if a == FDArg {
			a = strconv.Itoa(fd)
		}
		argv[i] = a
	}
	return h.child, argv
}

// Passed closes agentrun's copy of the program's end, once the program
// has it: from then on the program's end of the channel is only the
// program's.
func (h *Handover) Passed() {
	if h.child != nil {
		h.child.Close()
		h.child = nil
	}
}

// Ready waits, at most wait and until ctx is done, for the program to say
// it is ready; its failure, its end, its silence or ctx's error is the
// error.
func (h *Handover) Ready(ctx context.Context, wait time.Duration) error {
	line, err := h.line(ctx, wait)
	switch {
	case err != nil:
		return fmt.Errorf("waiting for the %s: %w", h.program, err)
	case line == "ready":
		return nil
	case strings.HasPrefix(line, "fail "):
		return fmt.Errorf("%s: %s", h.program, strings.TrimPrefix(line, "fail "))
	}
	return fmt.Errorf("the %s said %q, not that it is ready", h.program, line)
}

// Go hands the sandbox over to the program: it sends "go", waits at most
// wait (or ctx) for the acknowledgement, and closes agentrun's end, which
// the program waits for before it runs the task. An error means the
// program did not take the hand-over, and the channel stays open: an "ok"
// just past the wait must not be answered by the close that lets the
// task's code run, so the caller kills the sandbox first and closes the
// channel (Close) after.
func (h *Handover) Go(ctx context.Context, wait time.Duration) error {
	if h.conn == nil {
		return errors.New("handing over: the hand-over channel is closed")
	}
	_ = h.conn.SetWriteDeadline(time.Now().Add(wait))
	if _, err := h.conn.Write([]byte("go\n")); err != nil {
		return fmt.Errorf("handing over: %w", err)
	}
	line, err := h.line(ctx, wait)
	if err != nil {
		return fmt.Errorf("handing over: %w", err)
	}
	if line != "ok" {
		return fmt.Errorf("handing over: the %s said %q, not ok", h.program, line)
	}
	h.Close()
	return nil
}

// Close closes what is left of the channel on agentrun's side.
func (h *Handover) Close() {
	h.Passed()
	if h.conn != nil {
		h.conn.Close()
		h.conn = nil
	}
}

// errClosed is the program's end closing before a whole line.
var errClosed = errors.New("closed its end (or ended)")

// line reads one message, without its newline, within wait and ctx. A
// line longer than handoverLine, or a close before its newline, is an
// error; what it quotes of the program's bytes is escaped (untrusted.Text).
func (h *Handover) line(ctx context.Context, wait time.Duration) (string, error) {
	if h.conn == nil {
		return "", errors.New("the hand-over channel is closed")
	}
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = h.conn.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = h.conn.SetReadDeadline(time.Now()) })
	defer stop()
	// One byte at a time: nothing past the newline is taken from the
	// socket, which holds the next message.
	var buf []byte
	b := make([]byte, 1)
	for len(buf) <= handoverLine {
		n, err := h.conn.Read(b)
		if n == 1 {
			if b[0] == '\n' {
				return untrusted.Text(string(buf)), nil
			}
			buf = append(buf, b[0])
			continue
		}
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return "", fmt.Errorf("no answer from the %s within %v", h.program, wait)
		case err != nil && !errors.Is(err, io.EOF):
			return "", err
		}
		if len(buf) > 0 {
			return "", fmt.Errorf("the %s %w after %q", h.program, errClosed, untrusted.Text(string(buf)))
		}
		return "", fmt.Errorf("the %s %w", h.program, errClosed)
	}
	return "", fmt.Errorf("a line from the %s longer than %d bytes", h.program, handoverLine)
}
