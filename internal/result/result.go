package result

import (
	"encoding/base64"
	"unicode/utf8"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// Exit statuses of `agentrun run` that are not the program's own.
const (
	ExitTimeout = 124 // the run hit its wall-clock timeout
	ExitSetup   = 125 // agentrun could not run the task (bad task, image, host)
	ExitKilled  = 137 // the program was killed (OOM or SIGKILL)
)

// Result is the outcome of one run, as printed by `agentrun run`.
type Result struct {
	ID      string `json:"id"`
	Session string `json:"session"`
	// ExitCode is the status `agentrun run` exits with (ExitStatus), the
	// same on every door: the program's own exit code (128+n when signal n
	// ended it), ExitTimeout (124) when it timed out, ExitKilled (137)
	// when it was OOM-killed, ExitSetup (125) when Error is set (the
	// program never ran, or agentrun failed after it). Settle sets it.
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal"`
	TimedOut  bool   `json:"timed_out"`
	OOMKilled bool   `json:"oom_killed"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	// StdoutBase64 and StderrBase64 hold the kept output's exact bytes when
	// they are not valid UTF-8, which Stdout and Stderr (JSON strings) can
	// only carry with each bad byte replaced by U+FFFD.
	StdoutBase64    string          `json:"stdout_base64,omitempty"`
	StderrBase64    string          `json:"stderr_base64,omitempty"`
	StdoutTruncated bool            `json:"stdout_truncated"`
	StderrTruncated bool            `json:"stderr_truncated"`
	StdoutBytes     int64           `json:"stdout_bytes"`
	StderrBytes     int64           `json:"stderr_bytes"`
	DurationMS      int64           `json:"duration_ms"`
	CPUMS           int64           `json:"cpu_ms"`
	MemoryPeakBytes int64           `json:"memory_peak_bytes"`
	Image           string          `json:"image"`
	ImageDigest     string          `json:"image_digest"`
	Runtime         string          `json:"runtime"`
	Network         Network         `json:"network"`
	Files           map[string]File `json:"files"`
	Collect         *Collect        `json:"collect,omitempty"`
	// Value is the MIME bundle of a Python run's last expression's value
	// (none for None), and Display those of each object it displayed
	// (display(obj), a matplotlib figure shown or left open), in order, at
	// most 16: MIME type -> data, images as base64. DisplayDropped counts
	// the bundles left out: past the output cap or past 16, or not bundles.
	Value          Bundle   `json:"value,omitempty"`
	Display        []Bundle `json:"display,omitempty"`
	DisplayDropped int      `json:"display_dropped,omitempty"`
	// State is what a run with keep_state left of its globals for the
	// next run (its launcher's own report: the program's words).
	State *State `json:"state,omitempty"`
	// Tools are the run's calls to tool servers (spec §13); nil when the
	// task names none.
	Tools *Tools `json:"tools,omitempty"`
	Error string `json:"error"`
	// Err is the error behind Error, for callers in the same process
	// (errors.Is, errors.As); it is never encoded.
	Err error `json:"-"`
}

// State is a stateful run's report on its state: the globals kept and
// those dropped, with why, and the bytes of the state. Saved is false
// when the state was not kept (Reason says why: past
// sessions.state_max_bytes, or the run never reached its end), and then
// the session's previous state stays.
type State struct {
	Kept    []string          `json:"kept"`
	Dropped map[string]string `json:"dropped"`
	Bytes   int64             `json:"bytes"`
	Saved   bool              `json:"saved"`
	Reason  string            `json:"reason,omitempty"`
}

// Bundle is a MIME bundle, as a notebook shows an object: MIME type ->
// data (text/plain, text/html, text/markdown, text/latex, image/svg+xml,
// application/json as JSON text, image/png and image/jpeg as base64).
type Bundle = map[string]string

// Network lists the run's egress decisions, as agentrun's proxy and DNS
// server recorded them, and the allowed destinations it could not reach:
// the proxy's netpolicy.Report itself, and its records below are
// netpolicy's too.
type Network = netpolicy.Report

// NoNetworkNote is the Note of a run that had no network.
const NoNetworkNote = "no network: the task gave no hosts to reach (network.allow); " +
	"in its sandbox every name lookup and connection out fails"

// NoNetwork is the Network of a run that had no network at all: None, and
// NoNetworkNote.
func NoNetwork() Network {
	return Network{Allowed: []Allowed{}, Denied: []Denied{}, Failed: []Failed{}, None: true, Note: NoNetworkNote}
}

// The records of a run's Network.
type (
	Allowed        = netpolicy.Allowed
	Denied         = netpolicy.Denied
	Failed         = netpolicy.Failed
	ServiceRequest = netpolicy.ServiceRequest
	Approval       = netpolicy.ApprovalRecord
)

// File is one collected file. Error says why a matching path was not
// returned (not a regular file, over the collect limit). A name that is
// not valid UTF-8 is keyed by an escaped form (each invalid byte as \xNN)
// and its exact bytes are in NameBase64.
type File struct {
	Size          int64  `json:"size"`
	NameBase64    string `json:"name_base64,omitempty"`
	ContentBase64 string `json:"content_base64,omitempty"`
	Truncated     bool   `json:"truncated,omitempty"`
	Error         string `json:"error,omitempty"`
}

// NotRun is the result of a task whose program never ran (refused by
// policy, a bad task, an image or host set-up that failed): Error says
// why, and ExitCode is ExitSetup, the status `agentrun run` exits with, so
// that a client reading exit_code alone never takes it for a program that
// exited 0.
func NotRun(err error) *Result {
	return &Result{ExitCode: ExitSetup, Error: err.Error(), Err: err, Files: map[string]File{},
		Network: Network{Allowed: []Allowed{}, Denied: []Denied{}, Failed: []Failed{}}}
}

// ExitStatus is the status `agentrun run` exits with for r: 125 when
// Error is set (agentrun could not run the task, or failed after it), 124
// on timeout, 137 when the program was OOM-killed, else the program's own
// exit code (128+n for signal n).
func (r *Result) ExitStatus() int {
	switch {
	case r.Error != "":
		return ExitSetup
	case r.TimedOut:
		return ExitTimeout
	case r.OOMKilled:
		return ExitKilled
	}
	return r.ExitCode
}

// Settle makes ExitCode the exit status (ExitStatus), so that exit_code
// means one thing on every door, and says what the exit status of
// `agentrun run` says. Whoever sets Error, TimedOut or OOMKilled on a
// result that is handed out settles it then.
func (r *Result) Settle() { r.ExitCode = r.ExitStatus() }

// SetOutput records the kept output: as text, and as base64 too for a
// stream that is not valid UTF-8.
func (r *Result) SetOutput(stdout, stderr []byte) {
	r.Stdout, r.StdoutBase64 = text(stdout)
	r.Stderr, r.StderrBase64 = text(stderr)
}

func text(b []byte) (s, b64 string) {
	if !utf8.Valid(b) {
		b64 = base64.StdEncoding.EncodeToString(b)
	}
	return string(b), b64
}

// RawStdout is the kept stdout as the program wrote it.
func (r *Result) RawStdout() []byte { return raw(r.Stdout, r.StdoutBase64) }

// RawStderr is the kept stderr as the program wrote it.
func (r *Result) RawStderr() []byte { return raw(r.Stderr, r.StderrBase64) }

func raw(s, b64 string) []byte {
	if b64 != "" {
		if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
			return b
		}
	}
	return []byte(s)
}

// Collect reports on a run's collect: the patterns that matched nothing,
// and the bound that stopped the walk early ("" when none did).
type Collect struct {
	Unmatched []string `json:"unmatched"`
	Cut       string   `json:"cut,omitempty"`
}

// Tools is what a run's program asked of its tool servers.
type Tools struct {
	Calls []ToolCall `json:"calls"`
	// Dropped counts calls past the record's bound, not listed.
	Dropped int `json:"dropped,omitempty"`
}

// ToolCall is one call the program made through the broker: never its
// arguments or result, only the SHA-256 of the arguments as sent.
type ToolCall struct {
	Server string `json:"server"`
	Tool   string `json:"tool"` // escaped as the program's words (untrusted.Text), cut
	// Allowed: a rule allowed it and, if held, a human approved it.
	Allowed bool `json:"allowed"`
	// Reason says why a call was refused or failed (a rule, a bound, a
	// denial, the server's failure); "" for a call that was answered.
	Reason          string `json:"reason,omitempty"`
	Approval        string `json:"approval,omitempty"` // id of the held call's approval
	By              string `json:"by,omitempty"`       // who decided a held call
	DurationMS      int64  `json:"duration_ms"`
	IsError         bool   `json:"is_error"` // the server answered with isError
	ArgumentsSHA256 string `json:"arguments_sha256"`
}
