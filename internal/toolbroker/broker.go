// Package toolbroker brokers a run's calls to MCP tool servers (spec §13):
// the program asks over HTTP (http://tools.agentrun, served by the run's
// proxy), the broker rules each call by the server's rules, holds it for a
// human where a rule says so, makes it with the official MCP Go SDK's
// client to a stdio server it starts for the run (never as root, in a
// cgroup of its own, with the config's environment alone) or to a
// streamable-HTTP server, bounds it, and records it (never its arguments
// or result: their SHA-256).
package toolbroker

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/result"
)

// Host is the name the sandbox reaches the broker by.
const Host = "tools.agentrun"

// Server is one tool server a run may call, as the config declares it.
type Server struct {
	Name string
	// Command is a stdio server's argv; URL a streamable-HTTP server's
	// endpoint. Exactly one is set.
	Command []string
	Env     []EnvVar // a stdio server's whole environment
	UID     uint32   // a stdio server's user and group, never 0
	GID     uint32
	Shared  bool // one server for every run (see Shared)
	URL     string
	Headers []netpolicy.Inject // sent to URL, read from root-only files at each connect
	Rules   []Rule
}

// EnvVar is an environment variable of a stdio server: Value, or Prefix
// then the content of the root-only File, read when the server starts.
type EnvVar struct {
	Name, Value, Prefix, File string
}

// Rule allows the tools whose names match one of Tools (path.Match
// globs); Approve holds such a call for a human.
type Rule struct {
	Tools   []string
	Approve bool
}

// Limits bound one run's calls; past any, the call gets an error and the
// run goes on.
type Limits struct {
	Calls         int           // calls per run
	Concurrent    int           // calls at once
	ArgumentBytes int64         // a call's arguments as JSON
	ResultBytes   int64         // a call's result as JSON
	CallTimeout   time.Duration // a call to the server, the approval's wait excluded
}

// Options make one run's broker.
type Options struct {
	Run     string // the run's id, for logs and the servers' cgroups
	Servers []Server
	Limits  Limits
	// Approve decides calls a rule holds; nil denies them ("no way to
	// ask"). ApprovalTimeout bounds the wait (0: netpolicy's default).
	Approve         netpolicy.ApproveFunc
	ApprovalTimeout time.Duration
	// CgroupParent is where each stdio server's cgroup is made.
	CgroupParent string
	// Shared holds the servers marked Shared, kept between runs; nil
	// starts every server for this run alone.
	Shared *Shared
	// Logf logs host-side failures (never arguments or results).
	Logf func(format string, args ...any)
}

// Broker is one run's tool broker.
type Broker struct {
	opts Options
}

// New makes the broker of one run; it starts nothing (a stdio server
// starts at the run's first call to it, or at Start).
func New(opts Options) (*Broker, error) {
	return nil, errors.New("toolbroker: not built yet")
}

// Start starts the run's stdio servers ahead of its first call (for a
// pooled sandbox's run).
func (b *Broker) Start(ctx context.Context) error { return errors.New("toolbroker: not built yet") }

// Handler serves the sandbox's requests: GET /v1/tools, POST /v1/call.
func (b *Broker) Handler() http.Handler { return http.NotFoundHandler() }

// Report is the run's calls so far.
func (b *Broker) Report() *result.Tools { return &result.Tools{Calls: []result.ToolCall{}} }

// Close stops the run's servers (every process of their cgroups) and
// waits for calls in flight to end.
func (b *Broker) Close() error { return nil }

// Shared keeps the servers marked Shared between runs, for a runner's
// lifetime.
type Shared struct{}

// Close stops every shared server.
func (s *Shared) Close() error { return nil }
