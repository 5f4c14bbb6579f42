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
}

// Limits are the limits the run was given, in bytes, milliseconds and cores.
type Limits struct {
	TimeoutMS     int64    `json:"timeout_ms"`
	Memory        int64    `json:"memory"`
	CPUs          float64  `json:"cpus"`
	Pids          int64    `json:"pids"`
	OutputBytes   int64    `json:"output_bytes"`
	TmpSize       int64    `json:"tmp_size"`
	WorkspaceSize int64    `json:"workspace_size"`
	NetworkAllow  []string `json:"network_allow,omitempty"`
}

// Log writes records as JSON lines. It is safe for concurrent use, also
// across processes appending to the same file.
type Log struct {
	mu sync.Mutex
	w  io.Writer
	f  *os.File // nil when writing to a stream that is not ours to close
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
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening audit log: %w", err)
	}
	return &Log{w: f, f: f}, nil
}

// Write appends rec as one line. The line is written with a single write
// call under an exclusive lock, so lines never interleave.
func (l *Log) Write(rec *Record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding audit record: %w", err)
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		if err := unix.Flock(int(l.f.Fd()), unix.LOCK_EX); err != nil {
			return fmt.Errorf("locking audit log: %w", err)
		}
		defer unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	}
	if _, err := l.w.Write(line); err != nil {
		return fmt.Errorf("writing audit log: %w", err)
	}
	return nil
}

// Close closes the log file, if it is one.
func (l *Log) Close() error {
	if l.f != nil {
		return l.f.Close()
	}
	return nil
}
