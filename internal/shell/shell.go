// Package shell is `agentrun shell`: an interactive shell in a new live
// sandbox of agentrun serve, on the caller's terminal, as `docker run -it
// --rm` gives. The sandbox is made for the shell and ended with it.
//
// The terminal is the person's own window into the sandbox: what the
// shell prints reaches it as it is (escape sequences included, as they
// do over ssh), with the terminal in raw mode while the shell runs.
package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/console"

	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
)

// Command is the shell run: the image's bash if it has one, else its
// /bin/sh.
const Command = "if command -v bash >/dev/null 2>&1; then exec bash; fi; exec /bin/sh"

// deleteWait bounds the sandbox's DELETE once the shell is done.
const deleteWait = time.Minute

// defaultSize is the terminal's size when the input is not a terminal.
var defaultSize = server.TTYSize{Rows: 24, Cols: 80}

// Run makes a live sandbox of req's shape on c, runs the shell in it on
// a pseudo-terminal of in's size, with in (a terminal, put in raw mode
// while it runs, or not) as its input and out as its terminal, and
// resizes it as in's window changes (SIGWINCH). When the shell ends
// (Ctrl-D, exit), or ctx does, the sandbox is deleted; Run returns the
// shell's exit status, or why there is none.
func Run(ctx context.Context, c *server.Client, req server.SandboxRequest, in *os.File, out io.Writer) (code int, err error) {
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return 0, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), deleteWait)
		defer cancel()
		if derr := c.DeleteSandbox(dctx, sb.ID); derr != nil && err == nil {
			err = fmt.Errorf("deleting sandbox %s: %w", sb.ID, derr)
		}
	}()

	term, size := terminal(in)
	pid, err := c.Start(ctx, sb.ID, server.ProcessRequest{Cmd: Command, TTY: &size})
	if err != nil {
		return 0, err
	}
	if term != nil {
		if err := term.SetRaw(); err != nil {
			return 0, fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		defer term.Reset()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go resizes(ctx, c, sb.ID, pid, term, winch)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go forward(ctx, c, sb.ID, pid, in)
	exit, err := c.Attach(ctx, sb.ID, pid, func(ev runapi.ProcessEvent) error {
		data, derr := ev.Output()
		if derr != nil {
			return derr
		}
		_, werr := out.Write(data)
		return werr
	})
	if err != nil {
		return 0, err
	}
	if exit.ExitCode == nil {
		return 0, errors.New("the shell ended without an exit status")
	}
	return *exit.ExitCode, nil
}

// terminal is in as a console and its size; nil and defaultSize when it
// is not a terminal.
func terminal(in *os.File) (console.Console, server.TTYSize) {
	term, err := console.ConsoleFromFile(in)
	if err != nil {
		return nil, defaultSize
	}
	return term, sizeOf(term)
}

// sizeOf is term's size, within the bounds a sandbox's terminal takes.
func sizeOf(term console.Console) server.TTYSize {
	ws, err := term.Size()
	if err != nil || ws.Height == 0 || ws.Width == 0 {
		return defaultSize
	}
	return server.TTYSize{Rows: min(int(ws.Height), runapi.MaxTTYSize), Cols: min(int(ws.Width), runapi.MaxTTYSize)}
}

// resizes gives the shell's terminal term's size at each SIGWINCH.
func resizes(ctx context.Context, c *server.Client, id string, pid int, term console.Console, winch <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
			_ = c.Resize(ctx, id, pid, sizeOf(term))
		}
	}
}

// forward sends what in gives to the shell's terminal, a read at a time,
// until in ends (then the terminal's end of file) or ctx does.
func forward(ctx context.Context, c *server.Client, id string, pid int, in io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if werr := c.WriteStdin(ctx, id, pid, buf[:n], false); werr != nil {
				return // the shell has ended, or the server is gone
			}
		}
		if err != nil {
			_ = c.WriteStdin(ctx, id, pid, nil, true)
			return
		}
	}
}
