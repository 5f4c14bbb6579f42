package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/agentrun/agentrun/internal/runapi"
)

// Set keeps the live sandboxes of one server, each its user's alone, at
// most max at once (those being created count).
type Set struct {
	mu       sync.Mutex
	max      int
	byID     map[string]*Sandbox
	creating int
	closed   bool // by CloseAll: no more sandboxes
}

// NewSet returns an empty set of at most max live sandboxes.
func NewSet(max int) *Set { return &Set{max: max, byID: map[string]*Sandbox{}} }

// ErrTooMany is wrapped by the refusal of a sandbox past the bound;
// ErrClosed by that of one after CloseAll.
var (
	ErrTooMany = runapi.ErrTooManySandboxes
	ErrClosed  = runapi.ErrSandboxesClosed
)

// SetMax bounds the sandboxes live at once from now on: those live
// already stay, past a lower bound.
func (s *Set) SetMax(n int) {
	s.mu.Lock()
	s.max = n
	s.mu.Unlock()
}

// Len is the number of sandboxes in the set.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// Reserve takes a place for a sandbox about to be created; release gives
// it back once the sandbox is added (or its creation failed).
func (s *Set) Reserve() (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if len(s.byID)+s.creating >= s.max {
		return nil, fmt.Errorf("%w: sandboxes.max is %d", ErrTooMany, s.max)
	}
	s.creating++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.creating--
			s.mu.Unlock()
		})
	}, nil
}

// Add keeps sb until it ends. After CloseAll it ends sb instead, and
// returns ErrClosed.
func (s *Set) Add(sb *Sandbox) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.Join(ErrClosed, sb.end(EndStopped))
	}
	s.byID[sb.ID] = sb
	s.mu.Unlock()
	go func() {
		<-sb.Done()
		s.mu.Lock()
		delete(s.byID, sb.ID)
		s.mu.Unlock()
	}()
	return nil
}

// Get is user's sandbox id, nil if there is none: another user's is
// none, and so is one that ended (whose removal from the set may not
// have happened yet).
func (s *Set) Get(user, id string) *Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.byID[id]; sb != nil && sb.User == user && !sb.ended() {
		return sb
	}
	return nil
}

// List is user's sandboxes, by id.
func (s *Set) List(user string) []*Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Sandbox
	for _, sb := range s.byID {
		if sb.User == user && !sb.ended() {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// CloseAll ends every sandbox of the set (serve's stop), and waits for
// their tear-down; from then on the set takes none (a creation going on
// ends its sandbox at Add).
func (s *Set) CloseAll() error {
	s.mu.Lock()
	s.closed = true
	all := make([]*Sandbox, 0, len(s.byID))
	for _, sb := range s.byID {
		all = append(all, sb)
	}
	s.mu.Unlock()
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, sb := range all {
		wg.Go(func() { errs[i] = sb.end(EndStopped) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
