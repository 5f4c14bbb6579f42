// Package runapi is what the doors (serve, the NATS worker, MCP) need of
// the runner: the function that runs a plan (Func), the hooks a caller
// follows a run with (Hooks) and what the warm pool holds (PoolStats);
// and what they share without importing one another (doors.go): a
// task's refusal (Refusal), and the approver that a door handing a task
// to another passes on with it (WithApprover). It never imports the
// runner or a runtime, so that the doors build without libcontainer;
// cmd/agentrun hands them the runner's Run and its pool's Stats.
package runapi

import (
	"context"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

// Func runs a plan and returns its result, never nil, calling the hooks as
// the run goes; the runner's Run is one.
type Func func(ctx context.Context, p *task.Plan, hooks Hooks) *result.Result

// OutputFunc receives the program's output as it is kept: stream is
// "stdout" or "stderr", and data is the program's bytes (at most the run's
// output cap per stream in all). It may be called from two goroutines at
// once, and must not keep data.
type OutputFunc func(stream string, data []byte)

// Hooks let a caller follow a run as it goes; each may be nil.
type Hooks struct {
	// Output gets the program's kept output as it arrives (from two
	// goroutines at once).
	Output OutputFunc
	// Display gets each display bundle of the result as the program shows
	// it (a figure shown, display(obj)), in the result's order: exactly
	// those that its Display lists, bounded as it is; called from one
	// goroutine at a time.
	Display func(bundle map[string]string)
	// Approve decides requests to services that an approve rule holds,
	// for the run of that id; it must return when its context ends. Nil
	// denies them.
	Approve approvals.RunFunc
	// ToolCalled counts each of the run's tool calls by server, tool and
	// outcome (metrics.Metrics.ToolCalled); called from the broker's
	// goroutines.
	ToolCalled func(server, tool, outcome string)
	// Setup gets how long the run's sandbox took to be ready (image, then
	// a pooled sandbox or a cold set-up) and whether it came from the pool,
	// once the program has run.
	Setup func(pooled bool, d time.Duration)
	// Result gets the result as soon as it is final: every field filled
	// (output, usage, collected files, network decisions), before the
	// sandbox is torn down, so that a server can answer while the
	// tear-down goes on. The run's audit record is written before it (a
	// failure to write it is in the result's Error). A failure of the
	// tear-down comes after that: it is in the result the Func returns
	// only, not in the audit record. A run with a kept workspace gets it
	// later instead, once the tear-down has unmounted the session's disk
	// and the session is free for its next run.
	Result func(*result.Result)
}

// PoolStats is what the warm pool holds now.
type PoolStats struct {
	Ready   map[string]int // image ref -> sandboxes ready
	Hits    int64          // runs served from the pool
	Misses  int64          // runs of a pooled image that ran cold
	LastErr string         // the latest failure to fill, "" once one succeeds
	Running int            // the runner's runs going on
	Filling int            // sandboxes being made now

	ImageHits, ImageMisses map[string]int64 // Hits and Misses per image ref
	// Warm is, per image ref with warm settings, WarmOK while it gets
	// warm sandboxes, or why it gets plain ones instead.
	Warm map[string]string
}

// WarmOK is PoolStats.Warm of an image that gets warm sandboxes.
const WarmOK = "warm"
