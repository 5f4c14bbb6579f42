package approvals

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"
)

// maxPending bounds the holds waiting in one Pending (the whole server);
// each run's proxy holds at most a few of its own.
const maxPending = 1024

// maxRecent is how many of the last decisions Pending keeps (the
// approvals page shows them).
const maxRecent = 20

// Decided is one of the last decisions: the hold and who or what decided
// it ("timeout" included).
type Decided struct {
	Hold
	Approved bool      `json:"approved"`
	By       string    `json:"by"`
	At       time.Time `json:"at"`
}

// Pending is the holds waiting for a decision in one process (serve's:
// those of streamed runs, and of unattended runs when server.approvals
// says how to reach a human), by run and approval id, until Decide takes
// one or its Ask stops waiting; and the last decisions. Its zero value is
// ready to use.
type Pending struct {
	// Counted gets each decision taken and the channel that brought it,
	// TimedOut each hold that no one decided in time (serve's metrics).
	// Set before the first Ask; each may be nil.
	Counted  func(channel string, approved bool)
	TimedOut func()

	mu      sync.Mutex
	pending map[string]*waiter // run + "/" + id
	recent  []Decided          // newest first, at most maxRecent
}

// waiter is a hold waiting in Pending.
type waiter struct {
	hold Hold
	ch   chan decision // buffered: the first decision wins
	by   string        // who a decision without a name is said to be from
}

// decision is an answer Decide took and the channel that brought it.
type decision struct {
	ok          bool
	by, channel string
}

// Ask registers h, announces it (announce, once Decide can take its
// decision; nil for none) and waits for the decision, or for ctx to end.
// by is who a decision that Decide takes without a name is said to be
// from.
func (p *Pending) Ask(ctx context.Context, h Hold, by string, announce func()) Decision {
	key := h.Run + "/" + h.ID
	w := &waiter{hold: h, ch: make(chan decision, 1), by: by}
	p.mu.Lock()
	if p.pending == nil {
		p.pending = map[string]*waiter{}
	}
	if len(p.pending) >= maxPending {
		p.mu.Unlock()
		return Decision{By: "too many approvals waiting on the server"}
	}
	p.pending[key] = w
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pending, key)
		p.mu.Unlock()
	}()
	if announce != nil {
		announce()
	}
	taken := func(d decision) Decision {
		if p.Counted != nil {
			p.Counted(d.channel, d.ok)
		}
		p.record(h, d.ok, d.by)
		return Decision{Approved: d.ok, By: d.by, Taken: true}
	}
	select {
	case d := <-w.ch:
		return taken(d)
	case <-ctx.Done():
		// A decision that Decide took (and its decider was told so)
		// before this one stops waiting wins over the time running out:
		// it is in w.ch already, put there with the hold taken off
		// pending.
		p.mu.Lock()
		_, waiting := p.pending[key]
		delete(p.pending, key)
		p.mu.Unlock()
		if !waiting {
			return taken(<-w.ch)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			if p.TimedOut != nil {
				p.TimedOut()
			}
			p.record(h, false, "timeout")
		} else {
			p.record(h, false, "request abandoned")
		}
		return Decision{}
	}
}

// record keeps a decision for the page.
func (p *Pending) record(h Hold, ok bool, by string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recent = slices.Insert(p.recent, 0, Decided{Hold: h, Approved: ok, By: by, At: time.Now().UTC().Truncate(time.Second)})
	if len(p.recent) > maxRecent {
		p.recent = p.recent[:maxRecent]
	}
}

// Decide answers the approval id of run, the decision brought by channel;
// false when none such waits. by "" is the hold's own label (Ask's by).
func (p *Pending) Decide(run, id string, ok bool, by, channel string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, found := p.pending[run+"/"+id]
	if !found {
		return false
	}
	delete(p.pending, run+"/"+id)
	if by == "" {
		by = w.by
	}
	w.ch <- decision{ok: ok, by: by, channel: channel}
	return true
}

// List returns the holds waiting, soonest to expire first, and the last
// decisions, newest first.
func (p *Pending) List() ([]Hold, []Decided) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hs := make([]Hold, 0, len(p.pending))
	for _, w := range p.pending {
		hs = append(hs, w.hold)
	}
	slices.SortFunc(hs, func(x, y Hold) int {
		if c := x.ExpiresAt.Compare(y.ExpiresAt); c != 0 {
			return c
		}
		return strings.Compare(x.Run+x.ID, y.Run+y.ID)
	})
	return hs, slices.Clone(p.recent)
}

// Count is the number of holds waiting.
func (p *Pending) Count() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(len(p.pending))
}
