package sandbox

import (
	"context"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
)

// Door is a server's live sandboxes as the doors see them
// (runapi.Sandboxes): a Set whose sandboxes a runner sets up.
type Door struct {
	r   *runner.Runner
	set *Set
}

var _ runapi.Sandboxes = (*Door)(nil)

// NewDoor keeps live sandboxes within the config's bounds, set up by r.
func NewDoor(r *runner.Runner, b config.Sandboxes) *Door {
	d := &Door{r: r, set: NewSet(b.Max)}
	d.SetBounds(b)
	return d
}

// Create sets up a sandbox within the set's bounds and keeps it there.
func (d *Door) Create(ctx context.Context, plan *task.Plan, user string, lifetime, maxLifetime time.Duration) (runapi.Sandbox, error) {
	release, err := d.set.Reserve(user, plan.Limits.Memory)
	if err != nil {
		return nil, err
	}
	defer release()
	sb, err := Create(ctx, d.r, plan, user, Options{Lifetime: lifetime, MaxLifetime: maxLifetime})
	if err != nil {
		return nil, err
	}
	if err := d.set.Add(sb); err != nil {
		return nil, err
	}
	return doorSandbox{sb}, nil
}

// Get is user's sandbox id, nil if none.
func (d *Door) Get(user, id string) runapi.Sandbox {
	if sb := d.set.Get(user, id); sb != nil {
		return doorSandbox{sb}
	}
	return nil
}

// List is user's sandboxes, by id.
func (d *Door) List(user string) []runapi.Sandbox {
	var out []runapi.Sandbox
	for _, sb := range d.set.List(user) {
		out = append(out, doorSandbox{sb})
	}
	return out
}

// SetBounds bounds the sandboxes to come.
func (d *Door) SetBounds(b config.Sandboxes) { d.set.SetBounds(BoundsOf(b)) }

// Live is the number of live sandboxes.
func (d *Door) Live() int { return d.set.Len() }

// CloseAll ends every sandbox; no more are made.
func (d *Door) CloseAll() error { return d.set.CloseAll() }

// doorSandbox is a *Sandbox whose processes are runapi.Processes.
type doorSandbox struct{ *Sandbox }

func (s doorSandbox) Exec(req runapi.ExecRequest) (runapi.Process, error) {
	p, err := s.Sandbox.Exec(req)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (s doorSandbox) Process(pid int) runapi.Process {
	if p := s.Sandbox.Process(pid); p != nil {
		return p
	}
	return nil
}
