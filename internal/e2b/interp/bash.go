package interp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
)

// Bash is the language of a bash context: the image's bash, kept alive
// in the sandbox as a Python context's interpreter is, its state (shell
// variables, functions, cwd) kept from cell to cell.
const Bash = "bash"

// bashArgv runs a bash context's shell, reading its cells on stdin.
var bashArgv = []string{"bash", "--noprofile", "--norc"}

// A bash cell is sent as a script that reads the cell's code into a
// variable through a here-document whose delimiter is the context's
// random token, evaluates it with its stdin /dev/null (and the cell's
// env vars for its time), then writes the token and the status to
// stdout, and the token to stderr: the host reads the output as the
// cell's up to the token on each stream. The token is the context's own
// (128 random bits, never sent but in these scripts); code that reads the
// shell's own stdin could see it and end its own cell early, nothing
// else: a bash cell has no results to forge.

// envName matches a variable name bash takes; it is compiled on first
// use, not in the init of every agentrun process.
var envName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// bashCell is the script of one cell, ended by marker.
func bashCell(token, marker, code string, env map[string]string) (string, error) {
	var assign strings.Builder
	for k, v := range env {
		if !envName().MatchString(k) {
			return "", errkind.Mark(errkind.Invalid, fmt.Errorf("env_vars: %q is not a name bash takes", k))
		}
		assign.WriteString(k + "='" + strings.ReplaceAll(v, "'", `'\''`) + "' ")
	}
	if !strings.HasSuffix(code, "\n") {
		code += "\n"
	}
	return "IFS= read -r -d '' __agentrun_cell <<'" + token + "'\n" + code + token + "\n" +
		assign.String() + "eval \"$__agentrun_cell\" </dev/null\n" +
		"printf '%s:%d\\n' " + marker + " \"$?\"; printf '%s\\n' " + marker + " >&2\n", nil
}

// maxStatus bounds what is kept after a cell's mark: its status.
const maxStatus = 32

// bashStream is one output stream of a bash cell, read up to the token.
type bashStream struct {
	name string
	buf  []byte
	seen bool // the token came
}

// take adds data and returns what of it is the cell's output for sure:
// all before the token, or all but a tail that may be the token's start.
func (b *bashStream) take(data []byte, token string) []byte {
	if b.seen {
		// The status after the mark, which may come in a later chunk.
		b.buf = append(b.buf, data[:min(len(data), max(0, maxStatus-len(b.buf)))]...)
		return nil
	}
	b.buf = append(b.buf, data...)
	if i := bytes.Index(b.buf, []byte(token)); i >= 0 {
		out := b.buf[:i]
		b.buf = append([]byte(nil), b.buf[i+len(token):]...)
		b.seen = true
		return out
	}
	keep := min(len(b.buf), len(token)-1)
	out := b.buf[:len(b.buf)-keep]
	b.buf = append([]byte(nil), b.buf[len(b.buf)-keep:]...)
	return out
}

// bashStatus reads the status after stdout's token (":N\n"); ok false
// until its newline came.
func bashStatus(rest []byte) (int, bool) {
	i := bytes.IndexByte(rest, '\n')
	if i < 0 || len(rest) == 0 || rest[0] != ':' {
		return 0, false
	}
	n, err := strconv.Atoi(string(rest[1:i]))
	return n, err == nil
}

// newToken is a context's token.
func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "AGENTRUN_" + hex.EncodeToString(b[:]), nil
}

// bashMarker is the end mark of a bash context's cell.
func (c *Context) bashMarker(cell int) string { return c.token + "_" + strconv.Itoa(cell) + "_" }

// bashSend sends cell to a bash context's shell. c.mu is held.
func (c *Context) bashSend(cell int, code string, env map[string]string) error {
	script, err := bashCell(c.token, c.bashMarker(cell), code, env)
	if err != nil {
		return err
	}
	if err := c.proc.WriteStdin([]byte(script), false); err != nil {
		return fmt.Errorf("sending the cell to the context's shell: %w", err)
	}
	return nil
}

// bashRead reads cell's output, sent with emit as it comes (nil:
// dropped), until its mark came on both streams; its status, or an
// *errEnded, or ctx's error. Output before it that is not its own (an
// interrupted cell's, a background job's) is read as its own. c.mu is
// held.
func (c *Context) bashRead(ctx context.Context, cell int, emit func(stream string, text string)) (int, error) {
	marker := c.bashMarker(cell)
	out, errOut := &bashStream{name: "stdout"}, &bashStream{name: "stderr"}
	for {
		evs, next, _ := c.proc.Next(ctx, c.seq)
		c.seq = next
		for _, ev := range evs {
			var s *bashStream
			switch ev.Event {
			case "stdout":
				s = out
			case "stderr":
				s = errOut
			case "exit":
				return 0, &errEnded{msg: c.endMessage(ev)}
			default:
				continue
			}
			data, err := ev.Output()
			if err != nil {
				continue
			}
			if text := s.take(data, marker); len(text) > 0 && emit != nil {
				emit(s.name, strings.ToValidUTF8(string(text), "\uFFFD"))
			}
		}
		if out.seen && errOut.seen {
			if status, ok := bashStatus(out.buf); ok {
				return status, nil
			}
		}
		if len(evs) == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if ex := c.proc.Exit(); ex != nil {
				return 0, &errEnded{msg: c.endMessage(*ex)}
			}
		}
	}
}

// startBashLocked waits for a bash context's new shell to end an empty
// cell. c.mu is held.
func (c *Context) startBashLocked(ctx context.Context) error {
	token, err := newToken()
	if err != nil {
		return err
	}
	c.token = token
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := c.bashSend(0, ":", nil); err != nil {
		return err
	}
	_, err = c.bashRead(ctx, 0, nil)
	return err
}

// executeBash runs req as cell in a bash context, as Execute does.
// c.mu is held.
func (c *Context) executeBash(ctx context.Context, cell int, req Request, send func(any)) error {
	if err := c.bashSend(cell, req.Code, req.Env); err != nil {
		return err
	}
	c.count++
	status, err := c.bashRead(ctx, cell, func(stream, text string) {
		send(map[string]any{"type": stream, "text": text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	})
	var ended *errEnded
	switch {
	case errors.As(err, &ended):
		send(map[string]any{"type": "error", "name": "ContextEnded", "value": ended.msg + "; its next cell starts a new one", "traceback": ""})
		return nil
	case err != nil && ctx.Err() != nil:
		// The client went: the shell is interrupted, and killed if the
		// cell does not end within the grace.
		_ = c.proc.Signal(syscall.SIGINT)
		wait, cancel := context.WithTimeout(context.Background(), interruptGrace)
		defer cancel()
		if _, err := c.bashRead(wait, cell, nil); err != nil {
			_ = c.proc.Signal(syscall.SIGKILL)
			<-c.proc.Done()
		}
		return nil
	case err != nil:
		return err
	}
	if status != 0 {
		send(map[string]any{"type": "error", "name": "ExitError", "value": fmt.Sprintf("exit status %d", status), "traceback": ""})
	}
	send(map[string]any{"type": "number_of_executions", "execution_count": c.count})
	return nil
}
