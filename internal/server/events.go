package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/agentrun/agentrun/internal/result"
)

// Event is one line of a streamed answer (POST /v1/runs?stream=1): output
// as the program writes it ("stdout", "stderr", with Data), then the
// result ("result", with Result), last.
type Event struct {
	Event  string         `json:"event"`
	Data   string         `json:"data,omitempty"`
	Result *result.Result `json:"result,omitempty"`
}

// events writes a streamed answer's lines in order. send never blocks the
// run: lines wait in a queue, which the run's output caps bound, while a
// writer sends them and flushes. A client that stops reading only loses
// its own answer.
type events struct {
	w    http.ResponseWriter
	mu   sync.Mutex
	q    [][]byte
	shut bool
	wake chan struct{}
	done chan struct{}
	once sync.Once
}

// newEvents starts the streamed answer: status 200 and NDJSON.
func newEvents(w http.ResponseWriter) *events {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	e := &events{w: w, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go e.write()
	return e
}

// send queues one line; after close it is dropped.
func (e *events) send(ev Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	e.mu.Lock()
	if !e.shut {
		e.q = append(e.q, append(b, '\n'))
	}
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// close lets the queued lines out and waits until they are written.
func (e *events) close() {
	e.once.Do(func() {
		e.mu.Lock()
		e.shut = true
		e.mu.Unlock()
		select {
		case e.wake <- struct{}{}:
		default:
		}
		<-e.done
	})
}

func (e *events) write() {
	defer close(e.done)
	failed := false
	for {
		<-e.wake
		e.mu.Lock()
		q, shut := e.q, e.shut
		e.q = nil
		e.mu.Unlock()
		if !failed && len(q) > 0 {
			failed = writeBounded(e.w, bytes.Join(q, nil)) != nil
		}
		if shut {
			e.mu.Lock()
			empty := len(e.q) == 0
			e.mu.Unlock()
			if empty {
				return
			}
		}
	}
}
