package approvals

import (
	"context"
	"sync"
)

// Slot takes the first decision on a hold, until its waiter stops
// waiting: a decision taken (and its decider told so) is the one Wait
// returns, even when ctx ends at the same moment. A worker's hold waits
// on one for the decision that comes over NATS. Its zero value is ready
// to use.
type Slot struct {
	mu     sync.Mutex
	closed bool
	d      Decision
	got    chan struct{}
	once   sync.Once
}

func (s *Slot) init() { s.once.Do(func() { s.got = make(chan struct{}) }) }

// Take keeps d unless a decision was taken or the waiter stopped
// waiting; it says whether d was taken.
func (s *Slot) Take(d Decision) bool {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed, s.d = true, d
	close(s.got)
	return true
}

// Wait returns the decision taken, or the zero Decision once ctx ends
// with none taken (later ones are then refused).
func (s *Slot) Wait(ctx context.Context) Decision {
	s.init()
	select {
	case <-s.got:
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.d
}
