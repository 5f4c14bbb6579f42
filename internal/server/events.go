package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sync"
	"unicode/utf8"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/result"
)

// Event is one line of a streamed answer (POST /v1/runs?stream=1): output
// as the program writes it ("stdout", "stderr", with Data), requests held
// for a decision ("approval", with Run and Approval), each bundle of the
// result's display as the program shows it ("display", with Display),
// then the result ("result", with Result), last. Data is cut only between UTF-8
// characters; output that is not UTF-8 comes with its exact bytes in
// DataBase64 as well (Data then has U+FFFD for each bad byte).
type Event struct {
	Event      string         `json:"event"`
	Data       string         `json:"data,omitempty"`
	DataBase64 string         `json:"data_base64,omitempty"`
	Result     *result.Result `json:"result,omitempty"`
	// Display is one MIME bundle of the result's Display, in its order.
	Display map[string]string `json:"display,omitempty"`
	// Run and Approval: a request of run Run to a service, or a tool call
	// (Approval.Kind "tool"), is held until POST /v1/runs/RUN/approvals/ID
	// decides ("approval"). Approval's method, url and body_excerpt (a
	// request), tool and arguments (a tool call) are the program's text,
	// escaped (see approvals.Approval): a client shows them as they are,
	// as the program's.
	Run      string              `json:"run,omitempty"`
	Approval *approvals.Approval `json:"approval,omitempty"`
}

// outputs turns the run's output chunks into events, holding back the
// start of a UTF-8 character cut at a chunk's end until the rest of it
// comes (or the run ends).
type outputs struct {
	ev   *events
	mu   sync.Mutex
	held map[string][]byte // stream -> an incomplete character, at most 3 bytes
}

func newOutputs(ev *events) *outputs { return &outputs{ev: ev, held: map[string][]byte{}} }

// send is a runapi.Hooks.Output.
func (o *outputs) send(stream string, data []byte) {
	o.mu.Lock()
	b := append(o.held[stream], data...)
	whole, rest := splitRune(b)
	o.held[stream] = append([]byte(nil), rest...)
	o.mu.Unlock()
	if len(whole) > 0 {
		o.ev.send(outputEvent(stream, whole))
	}
}

// flush sends what is held back: the run has ended.
func (o *outputs) flush() {
	o.mu.Lock()
	held := o.held
	o.held = map[string][]byte{}
	o.mu.Unlock()
	for _, stream := range []string{"stdout", "stderr"} {
		if len(held[stream]) > 0 {
			o.ev.send(outputEvent(stream, held[stream]))
		}
	}
}

// splitRune cuts b before a UTF-8 character that is not complete at its
// end.
func splitRune(b []byte) (whole, rest []byte) {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i], b[i:]
			}
			break
		}
	}
	return b, nil
}

func outputEvent(stream string, b []byte) Event {
	ev := Event{Event: stream, Data: string(b)}
	if !utf8.Valid(b) {
		ev.DataBase64 = base64.StdEncoding.EncodeToString(b)
	}
	return ev
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
