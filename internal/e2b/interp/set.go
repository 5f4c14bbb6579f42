package interp

import (
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/runapi"
)

// Set keeps the code interpreter of each live sandbox that has one, by
// the sandbox's id, for the sandbox's life.
type Set struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	sb runapi.Sandbox
	in *Interpreter
}

// NewSet is an empty Set.
func NewSet() *Set { return &Set{m: map[string]*entry{}} }

// For is sb's code interpreter, made at its first need. It forgets those
// of sandboxes past their end (Drop is for those that ended before).
func (s *Set) For(sb runapi.Sandbox) *Interpreter {
	info := sb.Info()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, e := range s.m {
		if id != info.ID && e.sb.Info().ExpiresAt.Before(now) {
			delete(s.m, id)
			go e.in.Close()
		}
	}
	if e := s.m[info.ID]; e != nil && e.sb == sb {
		return e.in
	}
	in := New(sb)
	s.m[info.ID] = &entry{sb: sb, in: in}
	return in
}

// Drop closes and forgets the code interpreter of sandbox id, if it has
// one: call it as the sandbox ends.
func (s *Set) Drop(id string) {
	s.mu.Lock()
	e := s.m[id]
	delete(s.m, id)
	s.mu.Unlock()
	if e != nil {
		e.in.Close()
	}
}

// Len is the number of sandboxes with a code interpreter kept.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
