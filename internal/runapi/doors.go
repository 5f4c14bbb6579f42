package runapi

import (
	"context"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/errkind"
)

// Refusal is a task a door would not run, in words its asker can act on:
// Why is its kind, which each door answers by (serve with the kind's HTTP
// status, MCP by refusing the call), Field names the task field at fault,
// if one is, and RetryAfter says when it may be tried again. A door that
// hands a task on to another (MCP to serve's RunTask, serve's client over
// HTTP) gets the other's refusal as one of these.
type Refusal struct {
	Why        errkind.Kind
	Field      string
	Msg        string
	RetryAfter time.Duration // when it may be tried again; 0 if not said
}

func (r *Refusal) Error() string { return r.Msg }

// Kind is Why, so that errkind.Of tells a refusal apart by it.
func (r *Refusal) Kind() errkind.Kind { return r.Why }

// Approver decides a request of run held for approval, as Hooks.Approve
// does; it must return when ctx ends.
type Approver = approvals.RunFunc

type approverKey struct{}

// WithApprover returns ctx carrying approve: a door that hands a task to
// another (MCP's elicitation, to serve's RunTask) has the other ask it
// about the run's requests held for approval.
func WithApprover(ctx context.Context, approve Approver) context.Context {
	return context.WithValue(ctx, approverKey{}, approve)
}

// ApproverFrom is the approver ctx carries (WithApprover), or nil.
func ApproverFrom(ctx context.Context) Approver {
	a, _ := ctx.Value(approverKey{}).(Approver)
	return a
}

type toolCounterKey struct{}

// WithToolCounter returns ctx carrying count, which counts each tool call
// of what is made with ctx by server, tool and outcome (Hooks.ToolCalled):
// serve hands its metrics' to a live sandbox's set-up this way.
func WithToolCounter(ctx context.Context, count func(server, tool, outcome string)) context.Context {
	return context.WithValue(ctx, toolCounterKey{}, count)
}

// ToolCounterFrom is the counter ctx carries (WithToolCounter), or nil.
func ToolCounterFrom(ctx context.Context) func(server, tool, outcome string) {
	f, _ := ctx.Value(toolCounterKey{}).(func(server, tool, outcome string))
	return f
}
