package task

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/netpolicy"
)

// File is one input file; exactly one of Content and ContentBase64 is set.
type File struct {
	Content       *string `json:"content,omitempty"`
	ContentBase64 *string `json:"content_base64,omitempty"`
}

// Network is the task's egress request; an empty Allow means no network.
type Network struct {
	Allow []string `json:"allow"`
	// Services names services of the config's network.services that the
	// run may reach (through the proxy, with their rules and credentials).
	Services []string `json:"services"`
}

// Task is task.json as sent (docs/task-and-result.md#taskjson).
type Task struct {
	// ID names the task on the bus (agentrun submit, agentrun worker): the
	// key of its result and its de-duplication id. A local run ignores it.
	ID      string `json:"id"`
	Session string `json:"session"`
	// KeepWorkspace: the run gets session Session's kept /workspace.
	KeepWorkspace bool `json:"keep_workspace"`
	// KeepState: the run starts with the globals the session's previous
	// stateful run left, and leaves its own (implies KeepWorkspace).
	KeepState bool `json:"keep_state"`
	// ResetState: the session's state is cleared before the run.
	ResetState bool              `json:"reset_state"`
	Image      string            `json:"image"`
	Language   string            `json:"language"`
	Code       string            `json:"code"`
	Command    []string          `json:"command"`
	Stdin      string            `json:"stdin"`
	Files      map[string]File   `json:"files"`
	Collect    []string          `json:"collect"`
	Env        map[string]string `json:"env"`
	Limits     config.Limits     `json:"limits"`
	Network    Network           `json:"network"`
	// Tools names tool servers of the config's "tools" whose calls the
	// program may make through the broker (spec §13).
	Tools   []string `json:"tools"`
	Runtime string   `json:"runtime"`
}

// Limits are resolved, typed limits: sizes in bytes.
type Limits = config.Resolved

// Plan is a validated task with every default filled in from the config: all a backend needs.
type Plan struct {
	ID      string // the task's own id ("" when it names none)
	Session string
	// KeepWorkspace: /workspace is session Session's kept disk, not a
	// fresh tmpfs.
	KeepWorkspace bool
	// KeepState: the run restores and saves the session's state (Python
	// globals, serialised in the sandbox only); implies KeepWorkspace.
	KeepState bool
	// ResetState: the session's state is removed before the run.
	ResetState bool
	// Live: the plan is a live sandbox's, its program the sandbox's
	// holder (internal/sandbox): its sandbox is set up to be reached
	// (runner.Live), and a pool keeps sandboxes of its shape apart.
	Live    bool
	Image   string
	Runtime string
	// Argv is the program argv; with code, "{file}" in the language argv is
	// replaced by "/workspace/"+CodeFile.
	Argv []string
	// CodeFile is the workspace-relative name of the code file ("" when
	// Command is used); see CodeFileName.
	CodeFile string
	Code     []byte
	Stdin    []byte
	Files    map[string][]byte // cleaned workspace-relative names -> content (base64 decoded); never nil
	Collect  []string          // validated globs relative to /workspace
	Env      map[string]string // task env merged over config env; never nil
	Limits   Limits
	// Allow is the network allowlist ("name", "*.suffix", optional
	// ":port"; canonical, deduplicated), parsed once here for the proxy;
	// nil when the task names none.
	Allow    *netpolicy.Allowlist
	Services []string // names of the config's network.services the run may reach; deduplicated
	Tools    []string // names of the config's tools the run may call; deduplicated
	// ToolServers are the config's tool servers that Tools name, and
	// ToolLimits its tool_limits, as the config the task was resolved
	// under has them (nil and zero without Tools): the run takes them
	// from the plan, so that a reload of serve between the task's
	// admission and its run changes nothing of what it was admitted to.
	ToolServers config.Tools
	ToolLimits  config.ToolLimits
	// OwnImage: Image is one the config names itself (its image, or an
	// image of server.pool), which policy.registries does not bind; as
	// the config the task was resolved under has them.
	OwnImage bool
	TaskHash string // "sha256:" + hex of the raw task bytes; set by Load
}

// Offline reports whether p's run has no network at all: no allowlist,
// services or tools, so its sandbox has the loopback alone.
func (p *Plan) Offline() bool {
	return p.Allow.Empty() && len(p.Services) == 0 && len(p.Tools) == 0
}

// Caps on a task beyond the config's limits.
const (
	MaxTaskBytes   = 32 << 20 // raw task.json
	MaxFiles       = 10000    // entries in files
	MaxCollect     = 64       // entries in collect
	MaxAllow       = 256      // entries in network.allow
	MaxSessionLen  = 128
	MaxIDLen       = 128
	MaxPathLen     = 4096 // a file name or collect glob
	MaxPathElemLen = 255  // one component of it
)

// Error is a task problem. Field names the offending field the way it is
// written in task.json ("limits.memory", `files["../x"]`, "command[0]");
// it is "" for the task as a whole (oversize, not a JSON object).
type Error struct {
	Field  string
	Reason string
	Err    error // the cause, if any: errkind.ErrPolicy for policy refusals
}

// Error returns "task: " + Field + ": " + Reason ("task: " + Reason when Field is "").
func (e *Error) Error() string {
	if e.Field == "" {
		return "task: " + e.Reason
	}
	return "task: " + e.Field + ": " + e.Reason
}

func (e *Error) Unwrap() error { return e.Err }

// Kind is errkind.Policy for a refusal by the config's policy (Err wraps
// errkind.ErrPolicy), else errkind.Invalid: the task is at fault.
func (e *Error) Kind() errkind.Kind { return errkind.Or(e.Err, errkind.Invalid) }

func errorf(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Parse decodes task.json strictly: unknown or duplicate fields, wrong
// types, trailing data and more than MaxTaskBytes are an *Error naming the
// field. It checks syntax only; Resolve validates the values.
func Parse(data []byte) (*Task, error) {
	if len(data) > MaxTaskBytes {
		return nil, errorf("", "task is %d bytes, more than the maximum %d", len(data), MaxTaskBytes)
	}
	t := &Task{}
	if err := config.DecodeStrict(data, t); err != nil {
		var de *config.DecodeError
		if errors.As(err, &de) {
			return nil, &Error{Field: de.Path, Reason: de.Reason}
		}
		return nil, &Error{Reason: err.Error()}
	}
	return t, nil
}

// Load parses task.json and resolves it against cfg; the Plan's TaskHash is
// the sha256 of data.
func Load(data []byte, cfg *config.Config) (*Plan, error) {
	t, err := Parse(data)
	if err != nil {
		return nil, err
	}
	p, err := t.Resolve(cfg)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	p.TaskHash = "sha256:" + hex.EncodeToString(sum[:])
	return p, nil
}
