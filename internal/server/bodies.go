package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// A request's task body is read whole before the request takes a run slot
// or a place in the queue, under bounds of its own, apart from the run
// slots: bodyDeadline from the request's headers, task.MaxTaskBytes, and
// the server's body budget. So a client that stops sending its body holds
// no run slot and delays no other client's run; it holds only the memory
// of what it sent, and for bodyDeadline at most.

// bodyMemory is the budget of the task bodies the server holds outside run
// slots, those being read and those read whose request waits for a run
// slot (as a measure of the decoded task it keeps meanwhile), for
// max_concurrent slots: as many full-size tasks as the run slots hold, and
// 2 at least. A body that would take the budget past it is refused 503
// with Retry-After at once, rather than wait holding what it has: bodies
// that waited for each other would all run out their deadlines. An eighth
// of it is kept for small bodies (smallBody at most): clients that fill
// the budget with large bodies they do not finish leave room for the
// small tasks of the others.
func bodyMemory(maxConcurrent int) int64 {
	return int64(max(maxConcurrent, 2)) * task.MaxTaskBytes
}

// smallBody is the size up to which a body may take the budget's part
// kept for small ones.
const smallBody = 64 << 10

// bodyDeadline bounds the reading of a task body, from the end of its
// request's headers: a client that sends slowly loses its request (408).
// It holds no run slot meanwhile. A variable for the tests.
var bodyDeadline = 30 * time.Second

// Chunks of a body: the first is firstChunk at most, each next one as
// large as what arrived before it, up to bodyChunk. A body holds at most
// twice what its client sent, and firstChunk: a client that sends little
// and stops makes the server hold little.
const (
	firstChunk = 4 << 10
	bodyChunk  = 1 << 20
)

// bodyBudget counts the bytes of the task bodies the server holds outside
// run slots against its bound (bodyMemory), and the bodies being read.
type bodyBudget struct {
	max     atomic.Int64 // Reload may change it
	used    atomic.Int64
	reading atomic.Int64
}

// take counts n more bytes, unless that would pass the bound (less the
// part kept for small bodies, unless small): then it counts nothing and
// says false.
func (b *bodyBudget) take(n int64, small bool) bool {
	limit := b.max.Load()
	if !small {
		limit -= limit / 8
	}
	for {
		u := b.used.Load()
		if u+n > limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// taskBody is a task's bytes, in the chunks they were read into, and the
// bytes of the budget they hold.
type taskBody struct {
	chunks [][]byte
	size   int
	budget *bodyBudget // nil: a task in memory already, not counted
	held   int64
}

// bodyOf is a task already in memory (RunTask's).
func bodyOf(data []byte) *taskBody {
	return &taskBody{chunks: [][]byte{data}, size: len(data)}
}

// bytes is the task as one slice. A body of more than one chunk is joined
// once, and the chunks are dropped.
func (b *taskBody) bytes() []byte {
	switch len(b.chunks) {
	case 0:
		return nil
	case 1:
		return b.chunks[0]
	}
	data := make([]byte, 0, b.size)
	for _, c := range b.chunks {
		data = append(data, c...)
	}
	b.chunks = [][]byte{data}
	return data
}

// free gives the budget's bytes back; again is nothing.
func (b *taskBody) free() {
	if b.budget != nil {
		b.budget.used.Add(-b.held)
	}
	b.held = 0
}

// grow adds a chunk for the rest of a body of which left bytes may still
// come, or refuses 503 when the budget has no room for it.
func (b *taskBody) grow(left int64) ([]byte, error) {
	n := min(max(int64(b.size), firstChunk), bodyChunk, left)
	if n <= 0 {
		return nil, errkind.Mark(errkind.TooLarge, fmt.Errorf("task is larger than the maximum %d bytes", task.MaxTaskBytes))
	}
	if !b.budget.take(n, b.held+n <= smallBody) {
		ref := refusal(fmt.Errorf("server busy: the task bodies being read or waiting for a run slot hold the %d MiB it keeps for them", b.budget.max.Load()>>20), errkind.Unavailable, "")
		ref.RetryAfter = time.Second
		return nil, ref
	}
	b.held += n
	c := make([]byte, 0, n)
	b.chunks = append(b.chunks, c)
	return c, nil
}

// errBodyMemory tells a refusal for the body budget from the others of
// readBody (for the metrics).
func errBodyMemory(err error) bool {
	var ref *runapi.Refusal
	return errors.As(err, &ref) && ref.Why == errkind.Unavailable
}

// readBody reads r's task, at most task.MaxTaskBytes within bodyDeadline,
// into chunks counted against the body budget; the body's free gives them
// back. Its error's kind is the answer's: TooLarge, Timeout, else Invalid;
// or a 503 *runapi.Refusal when the budget has no room.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (_ *taskBody, err error) {
	s.bodies.reading.Add(1)
	defer s.bodies.reading.Add(-1)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyDeadline))
	b := &taskBody{budget: &s.bodies}
	defer func() {
		if err != nil {
			// The rest of the body is not waited for (the deadline
			// stays): the connection is closed after the answer.
			b.free()
			r.Body.Close()
		}
	}()
	in := http.MaxBytesReader(w, r.Body, task.MaxTaskBytes)
	// Room for one byte more than may come, to see the body's end.
	left := int64(task.MaxTaskBytes) + 1
	if r.ContentLength >= 0 {
		left = r.ContentLength + 1
	}
	var c []byte
	for {
		if len(c) == cap(c) {
			if c, err = b.grow(left); err != nil {
				return nil, err
			}
		}
		n, rerr := in.Read(c[len(c):cap(c)])
		c = c[:len(c)+n]
		b.chunks[len(b.chunks)-1] = c
		b.size += n
		left -= int64(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, bodyError(rerr)
		}
	}
	// Lifted: the server watches the connection to see the client go.
	_ = rc.SetReadDeadline(time.Time{})
	return b, nil
}

// bodyError is the error of a body that could not be read.
func bodyError(err error) error {
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		return errkind.Mark(errkind.TooLarge, fmt.Errorf("task is larger than the maximum %d bytes", task.MaxTaskBytes))
	case errors.As(err, &ne) && ne.Timeout():
		return errkind.Mark(errkind.Timeout, fmt.Errorf("reading task: not sent within %v", bodyDeadline))
	}
	return errkind.Mark(errkind.Invalid, fmt.Errorf("reading task: %w", err))
}
