package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// Set keeps the live sandboxes of one server, each its user's alone,
// within its Bounds (those being created count).
type Set struct {
	mu       sync.Mutex
	b        Bounds
	byID     map[string]*Sandbox
	creating int
	// users counts each user's sandboxes, memory adds up their memory
	// limits: those live and those being created.
	users  map[string]int
	memory int64
	closed bool // by CloseAll: no more sandboxes
}

// Bounds bound a Set: Max sandboxes live at once, PerUser of one user's
// (0: no bound but Max), and Memory, the most their memory limits add up
// to (0: no bound).
type Bounds struct {
	Max, PerUser int
	Memory       int64
}

// BoundsOf is the config's bounds.
func BoundsOf(c config.Sandboxes) Bounds {
	return Bounds{Max: c.Max, PerUser: c.PerUser, Memory: c.MaxMemory.Bytes()}
}

// NewSet returns an empty set of at most max live sandboxes.
func NewSet(max int) *Set {
	return &Set{b: Bounds{Max: max}, byID: map[string]*Sandbox{}, users: map[string]int{}}
}

// ErrTooMany is wrapped by the refusal of a sandbox past sandboxes.max
// or sandboxes.max_memory; ErrQuota by that of one past its user's
// bound; ErrClosed by that of one after CloseAll.
var (
	ErrTooMany = runapi.ErrTooManySandboxes
	ErrQuota   = runapi.ErrSandboxQuota
	ErrClosed  = runapi.ErrSandboxesClosed
)

// SetBounds bounds the sandboxes created from now on: those live already
// stay, past lower bounds.
func (s *Set) SetBounds(b Bounds) {
	s.mu.Lock()
	s.b = b
	s.mu.Unlock()
}

// Len is the number of sandboxes in the set.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// Reserve takes a place for a sandbox of user about to be created, whose
// memory limit is memory; release gives it back once the sandbox is
// added (or its creation failed). A sandbox whose memory limit alone is
// past the bound is refused as above policy (errkind.Policy).
func (s *Set) Reserve(user string, memory int64) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b
	switch {
	case s.closed:
		return nil, ErrClosed
	case len(s.byID)+s.creating >= b.Max:
		return nil, fmt.Errorf("%w: sandboxes.max is %d", ErrTooMany, b.Max)
	case b.PerUser > 0 && s.users[user] >= b.PerUser:
		return nil, fmt.Errorf("%w: sandboxes.per_user is %d", ErrQuota, b.PerUser)
	case b.Memory > 0 && memory > b.Memory:
		return nil, errkind.Mark(errkind.Policy, fmt.Errorf("limits.memory: a sandbox of %d bytes is past sandboxes.max_memory (%d bytes) on its own", memory, b.Memory))
	case b.Memory > 0 && s.memory+memory > b.Memory:
		return nil, fmt.Errorf("%w: sandboxes.max_memory is %d bytes, of which the live sandboxes' limits take %d, and this one asks %d", ErrTooMany, b.Memory, s.memory, memory)
	}
	s.creating++
	s.countLocked(user, memory, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.creating--
			s.countLocked(user, memory, -1)
			s.mu.Unlock()
		})
	}, nil
}

// countLocked counts n sandboxes of user, each of memory, in or (n < 0)
// out.
func (s *Set) countLocked(user string, memory int64, n int) {
	s.memory += int64(n) * memory
	if s.users[user] += n; s.users[user] <= 0 {
		delete(s.users, user)
	}
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
	s.countLocked(sb.User, sb.memory, 1)
	s.mu.Unlock()
	go func() {
		<-sb.Done()
		s.mu.Lock()
		delete(s.byID, sb.ID)
		s.countLocked(sb.User, sb.memory, -1)
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
