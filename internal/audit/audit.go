package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/state"
)

// Record is one audit line.
type Record struct {
	Time            time.Time      `json:"time"`
	ID              string         `json:"id"`
	Session         string         `json:"session"`
	TaskHash        string         `json:"task_hash"`
	Image           string         `json:"image"`
	ImageDigest     string         `json:"image_digest"`
	Runtime         string         `json:"runtime"`
	Limits          Limits         `json:"limits"`
	Network         result.Network `json:"network"`
	Tools           *result.Tools  `json:"tools,omitempty"` // the run's tool calls, never their arguments
	ExitCode        int            `json:"exit_code"`
	Signal          string         `json:"signal,omitempty"`
	TimedOut        bool           `json:"timed_out"`
	OOMKilled       bool           `json:"oom_killed"`
	DurationMS      int64          `json:"duration_ms"`
	CPUMS           int64          `json:"cpu_ms"`
	MemoryPeakBytes int64          `json:"memory_peak_bytes"`
	StdoutBytes     int64          `json:"stdout_bytes"`
	StderrBytes     int64          `json:"stderr_bytes"`
	Files           []string       `json:"files,omitempty"`
	Error           string         `json:"error,omitempty"`
	Detail          string         `json:"detail,omitempty"` // system error detail kept out of the result
	// Truncated is set when the record was cut to MaxRecordBytes.
	Truncated *Truncation `json:"truncated,omitempty"`

	// A live sandbox's record has Kind "sandbox", its user, why it
	// ended, and its processes; its ID is the sandbox's, its usage that
	// of its whole cgroup, its duration its life.
	Kind  string `json:"kind,omitempty"`
	User  string `json:"user,omitempty"`
	Ended string `json:"ended,omitempty"`
	// Processes are its processes in the order they ended, at most
	// MaxProcesses; ProcessesNotListed counts those past it.
	Processes          []Process `json:"processes,omitempty"`
	ProcessesNotListed int       `json:"processes_not_listed,omitempty"`
}

// KindSandbox is the Kind of a live sandbox's record.
const KindSandbox = "sandbox"

// MaxProcesses bounds the processes a sandbox's record lists.
const MaxProcesses = 1000

// Process is one process of a live sandbox, as its record lists it.
type Process struct {
	// Pid is its pid inside the sandbox.
	Pid int `json:"pid"`
	// Command is its argv, each word escaped (untrusted.Text), the
	// words together cut to about maxCommand bytes (see CommandOf);
	// CommandWords is how many words it had when some were left out.
	Command      []string  `json:"command"`
	CommandWords int       `json:"command_words,omitempty"`
	TTY          bool      `json:"tty,omitempty"`
	Started      time.Time `json:"started"`
	ExitCode     int       `json:"exit_code"`
	Signal       string    `json:"signal,omitempty"`
	TimedOut     bool      `json:"timed_out"`
	DurationMS   int64     `json:"duration_ms"`
}

// Limits are the limits the run was given and the network it was allowed.
// In JSON they are one object: each of Values under its name, then
// network_allow and network_services when not empty.
type Limits struct {
	// Values are the run's resource limits, every one of config.LimitTable
	// under its name there, in bytes, cores or a count; a duration in
	// milliseconds, under its name and "_ms" (timeout_ms).
	Values map[string]float64
	// NetworkAllow is the run's allowlist.
	NetworkAllow []string
	// NetworkServices are the services of the config the run asked for.
	NetworkServices []string
}

const (
	networkAllowKey    = "network_allow"
	networkServicesKey = "network_services"
)

// MarshalJSON writes the limits as one flat object.
func (l Limits) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(l.Values)+2)
	for k, v := range l.Values {
		m[k] = v
	}
	if len(l.NetworkAllow) > 0 {
		m[networkAllowKey] = l.NetworkAllow
	}
	if len(l.NetworkServices) > 0 {
		m[networkServicesKey] = l.NetworkServices
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (l *Limits) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*l = Limits{Values: make(map[string]float64, len(m))}
	for k, raw := range m {
		var err error
		switch k {
		case networkAllowKey:
			err = json.Unmarshal(raw, &l.NetworkAllow)
		case networkServicesKey:
			err = json.Unmarshal(raw, &l.NetworkServices)
		default:
			var v float64
			err = json.Unmarshal(raw, &v)
			l.Values[k] = v
		}
		if err != nil {
			return fmt.Errorf("audit limits: %s: %w", k, err)
		}
	}
	return nil
}

// DefaultMaxBytes is the size past which the log file is rotated.
const DefaultMaxBytes = 64 << 20

// Log writes records as JSON lines. It is safe for concurrent use, also
// across processes appending to the same file. A log file is rotated
// when a line would take it past MaxBytes: it becomes PATH.1 (replacing
// the previous PATH.1) and a new PATH is started, so the log takes at
// most twice MaxBytes on disk.
type Log struct {
	mu   sync.Mutex
	w    io.Writer
	f    *os.File // nil when writing to a stream that is not ours to close
	path string

	// MaxBytes is the size at which the file rotates; 0 means
	// DefaultMaxBytes.
	MaxBytes int64
}

// Open opens the audit log at path, creating it (0600) and its directory
// (0750) if needed. "-" writes to stderr; "" discards records.
func Open(path string) (*Log, error) {
	switch path {
	case "":
		return &Log{w: io.Discard}, nil
	case "-":
		return &Log{w: os.Stderr}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("creating audit log directory: %w", err)
	}
	f, err := openFile(path)
	if err != nil {
		return nil, err
	}
	return &Log{w: f, f: f, path: path}, nil
}

func openFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening audit log: %w", err)
	}
	return f, nil
}

// Write appends rec as one line of at most MaxRecordBytes (see
// marshalBounded). The line is written with a single write call under an
// exclusive lock, so lines never interleave. A log that discards its
// records (Open of "") does nothing, not even encode rec: a run's record
// is made on the way to its answer.
func (l *Log) Write(rec *Record) error {
	if l.w == io.Discard {
		return nil
	}
	line, err := marshalBounded(rec)
	if err != nil {
		return fmt.Errorf("encoding audit record: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		unlock, err := l.lockCurrent(int64(len(line)))
		if err != nil {
			return err
		}
		defer unlock()
	}
	if _, err := l.w.Write(line); err != nil {
		return fmt.Errorf("writing audit log: %w", err)
	}
	return nil
}

// lockCurrent locks the file at l.path, following a rotation another
// Log (in this process or another) made, and rotates it first when n
// more bytes would take it past MaxBytes. l.mu is held.
func (l *Log) lockCurrent(n int64) (unlock func(), err error) {
	max := l.MaxBytes
	if max <= 0 {
		max = DefaultMaxBytes
	}
	for range 10 {
		lf := l.f
		fd := int(lf.Fd())
		if err := state.Flock(lf, unix.LOCK_EX); err != nil {
			return nil, fmt.Errorf("locking audit log: %w", err)
		}
		var have, cur unix.Stat_t
		ferr := unix.Fstat(fd, &have)
		perr := unix.Lstat(l.path, &cur)
		if ferr != nil {
			state.Flock(lf, unix.LOCK_UN)
			return nil, fmt.Errorf("audit log: %w", ferr)
		}
		if perr == nil && cur.Ino == have.Ino && cur.Dev == have.Dev {
			if have.Size == 0 || have.Size+n <= max {
				return func() { state.Flock(lf, unix.LOCK_UN) }, nil
			}
			// Full: rotate while holding the lock of the full file.
			if err := os.Rename(l.path, l.path+".1"); err != nil {
				state.Flock(lf, unix.LOCK_UN)
				return nil, fmt.Errorf("rotating audit log: %w", err)
			}
		}
		// Rotated (by us or another Log): write to the new file.
		state.Flock(lf, unix.LOCK_UN)
		f, err := openFile(l.path)
		if err != nil {
			return nil, err
		}
		l.f.Close()
		l.f, l.w = f, f
	}
	return nil, fmt.Errorf("audit log %s: rotated under us ten times", l.path)
}

// Close closes the log file, if it is one.
func (l *Log) Close() error {
	if l.f != nil {
		return l.f.Close()
	}
	return nil
}
