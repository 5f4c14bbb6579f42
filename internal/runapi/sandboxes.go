package runapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/task"
)

// Sandboxes is what serve needs of a host's live sandboxes (spec §17):
// each its user's alone, at most a bound of them live at once. The
// sandbox package's Door is one; cmd/agentrun hands it to serve.
type Sandboxes interface {
	// Create sets up a live sandbox of plan's shape for user, living
	// lifetime (at most maxLifetime from now, as SetTimeout). Past the
	// bound it fails with ErrTooManySandboxes (sandboxes.max or
	// max_memory), past user's with ErrSandboxQuota; once CloseAll
	// began, with ErrSandboxesClosed.
	Create(ctx context.Context, plan *task.Plan, user string, lifetime, maxLifetime time.Duration) (Sandbox, error)
	// Get is user's sandbox id, nil if none: another user's is none.
	Get(user, id string) Sandbox
	// List is user's live sandboxes, by id.
	List(user string) []Sandbox
	// SetBounds bounds the sandboxes created from now on: sandboxes.max
	// live at once, per_user of one user's, max_memory their memory
	// limits add up to.
	SetBounds(b config.Sandboxes)
	// Live is the number of sandboxes live now.
	Live() int
	// CloseAll ends every sandbox, and every later Create fails.
	CloseAll() error
}

// ErrTooManySandboxes is wrapped by the refusal of a sandbox past
// sandboxes.max or max_memory; ErrSandboxQuota by that of one past
// sandboxes.per_user; ErrSandboxesClosed by that of one while serve
// stops.
var (
	ErrTooManySandboxes = errors.New("too many live sandboxes")
	ErrSandboxQuota     = errors.New("too many live sandboxes of one user")
	ErrSandboxesClosed  = errors.New("the server is stopping: no new sandbox")
)

// SandboxInfo is a live sandbox as the API shows it.
type SandboxInfo struct {
	ID           string    `json:"id"`
	ExpiresAt    time.Time `json:"expires_at"`
	Image        string    `json:"image"` // its digest
	Created      time.Time `json:"created"`
	PreviewToken string    `json:"preview_token,omitempty"`
}

// Sandbox is one live sandbox.
type Sandbox interface {
	Info() SandboxInfo
	// SetTimeout makes it end d from now, within its max lifetime.
	SetTimeout(d time.Duration) (time.Time, error)
	// Close kills everything in it and tears it down.
	Close() error
	// Exec starts a process.
	Exec(req ExecRequest) (Process, error)
	// Process is the process of pid, nil if none.
	Process(pid int) Process
	// Processes lists its processes, running and recently ended.
	Processes() []ProcessInfo
	// ReadFile, WriteFile, Remove, List, ListDepth, Stat, MakeDir and
	// Rename reach its files in its writable places: a name is relative
	// to /workspace, or absolute in /workspace or /tmp; anything else,
	// or one holding "..", is refused. Never through a link, never
	// across a mount. WriteFile makes the file's missing parents;
	// ListDepth lists depth levels down (1 is List); MakeDir makes the
	// missing parents too and says whether it made the directory itself;
	// Rename stays within one place.
	ReadFile(name string, max int64) ([]byte, error)
	WriteFile(name string, r io.Reader, size int64) error
	Remove(name string) error
	List(name string) ([]FileInfo, error)
	ListDepth(name string, depth int) ([]FileInfo, error)
	Stat(name string) (FileInfo, error)
	MakeDir(name string) (created bool, err error)
	Rename(from, to string) error
	// DialPort connects to TCP port on its loopback, from inside its
	// network namespace, within a bound of connections per sandbox
	// (errkind.Busy past it); the connection closes when it idles or
	// the sandbox ends. A port nothing listens on is errkind.Upstream.
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// Process is a process of a live sandbox.
type Process interface {
	// Pid is its pid inside the sandbox.
	Pid() int
	// Next returns its events from seq on (the oldest kept, if those
	// were dropped), waiting while there are none and it runs, until
	// ctx ends; the next seq; and whether the exit is among them.
	Next(ctx context.Context, seq int) ([]ProcessEvent, int, bool)
	// Done is closed once its exit event is in; Exit is that event.
	Done() <-chan struct{}
	Exit() *ProcessEvent
	WriteStdin(data []byte, close bool) error
	Signal(sig syscall.Signal) error
	// Resize sets the size of its pseudo-terminal (ExecRequest.TTY).
	Resize(size TTYSize) error
	Info() ProcessInfo
}

// TTYSize is a pseudo-terminal's size, each at least 1 and at most
// MaxTTYSize.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// MaxTTYSize bounds a pseudo-terminal's rows and columns.
const MaxTTYSize = 1000

// ExecRequest is a process to start in a live sandbox.
type ExecRequest struct {
	// Command is its argv; Cmd a shell line run by /bin/sh -c. One of
	// the two.
	Command []string `json:"command,omitempty"`
	Cmd     string   `json:"cmd,omitempty"`
	// Cwd is its working directory ("" is /workspace, a relative one is
	// under it); Env adds to the sandbox's environment.
	Cwd string            `json:"cwd,omitempty"`
	Env map[string]string `json:"env,omitempty"`
	// Stdin keeps its stdin open for WriteStdin; otherwise it reads EOF.
	Stdin bool `json:"stdin,omitempty"`
	// TTY, if set, gives it a pseudo-terminal of that size as its
	// stdin, stdout and stderr: its output comes as "pty" events, its
	// stdin is kept open and goes to the terminal.
	TTY *TTYSize `json:"tty,omitempty"`
	// Timeout, if positive, kills it after so long.
	Timeout time.Duration `json:"-"`
}

// ProcessEvent is one event of a process, as the API streams it.
type ProcessEvent struct {
	Event string `json:"event"` // start, stdout, stderr, pty, exit
	Pid   int    `json:"pid,omitempty"`
	// Data is output that is UTF-8; DataB64 output that is not, in
	// base64.
	Data    string `json:"data,omitempty"`
	DataB64 string `json:"data_b64,omitempty"`
	// Exit's fields.
	ExitCode   *int   `json:"exit_code,omitempty"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	// Dropped counts, on exit, the output bytes not kept (past the cap).
	Dropped int64 `json:"dropped_bytes,omitempty"`
}

// Output is the bytes an output event carries: Data's, or DataB64's
// decoded.
func (e ProcessEvent) Output() ([]byte, error) {
	if e.DataB64 != "" {
		b, err := base64.StdEncoding.DecodeString(e.DataB64)
		if err != nil {
			return nil, fmt.Errorf("an event's data_b64: %w", err)
		}
		return b, nil
	}
	return []byte(e.Data), nil
}

// ProcessInfo is a process as a list shows it.
type ProcessInfo struct {
	Pid      int       `json:"pid"`
	Command  []string  `json:"command"`
	TTY      bool      `json:"tty,omitempty"`
	Started  time.Time `json:"started"`
	Running  bool      `json:"running"`
	ExitCode *int      `json:"exit_code,omitempty"`
}

// FileInfo is one entry of a live sandbox's directory list, or a file's
// stat.
type FileInfo struct {
	Name string `json:"name"`
	// Path is its absolute path in the sandbox.
	Path  string    `json:"path"`
	Type  string    `json:"type"` // file, dir, symlink, other
	Size  int64     `json:"size"`
	Mode  string    `json:"mode"` // its permission bits, in octal
	MTime time.Time `json:"mtime"`
	// Target is a symlink's target, as it was written (never followed).
	Target string `json:"symlink_target,omitempty"`
	// UID and GID own it (the sandbox's uid is its user's).
	UID int `json:"-"`
	GID int `json:"-"`
}
