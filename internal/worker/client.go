package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

// headroom is what a stored result leaves of the server's max payload for
// the message's subject and headers.
const headroom = 4 << 10

// Encode is res as JSON, at most maxPayload-headroom bytes: a result too
// big for the bus keeps its fields but loses its output and files, and
// says so in its error.
func Encode(res *result.Result, maxPayload int64) ([]byte, error) {
	data, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("encoding result: %w", err)
	}
	limit := maxPayload - headroom
	if int64(len(data)) <= limit {
		return data, nil
	}
	small := *res
	small.Stdout, small.Stderr, small.Files = "", "", map[string]result.File{}
	small.StdoutTruncated, small.StderrTruncated = res.StdoutBytes > 0, res.StderrBytes > 0
	small.Error = fmt.Sprintf("the result is %d bytes, more than NATS carries (%d): output and files dropped", len(data), limit)
	if res.Error != "" {
		small.Error += "; " + res.Error
	}
	if len(small.Error) > 4096 {
		small.Error = small.Error[:4096]
	}
	small.Settle()
	return json.Marshal(&small)
}

// NewID is a fresh task id.
func NewID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "t-" + hex.EncodeToString(b)
}

// TaskID is the id of task.json data: its own "id", or a new one. It
// checks the task's syntax, not its values: every worker judges those
// under its own policy.
func TaskID(data []byte) (string, error) {
	t, err := task.Parse(data)
	if err != nil {
		return "", err
	}
	if t.ID == "" {
		return NewID(), nil
	}
	if err := task.CheckID(t.ID); err != nil {
		return "", &task.Error{Field: "id", Reason: err.Error()}
	}
	return t.ID, nil
}

// Publish puts task.json data on the task subject under id. A second
// publish of the same id within the stream's de-duplication window is
// dropped by the stream; duplicate says so.
func Publish(ctx context.Context, js jetstream.JetStream, wc config.Worker, id string, data []byte) (duplicate bool, err error) {
	msg := nats.NewMsg(wc.Subject)
	msg.Data = data
	msg.Header.Set(IDHeader, id)
	ack, err := js.PublishMsg(ctx, msg)
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return false, fmt.Errorf("publishing on %s: no stream takes it: no agentrun worker has started on this NATS yet (%w)", wc.Subject, err)
	}
	if err != nil {
		return false, fmt.Errorf("publishing on %s: %w", wc.Subject, err)
	}
	return ack.Duplicate, nil
}

// Follow writes the live output of task id to w as it comes (both
// streams), until the subscription it returns is ended. The events are
// best effort: the result holds the output for sure.
func Follow(nc *nats.Conn, wc config.Worker, id string, w io.Writer) (*nats.Subscription, error) {
	if wc.Events == "" {
		return nil, errors.New("worker.events is off: there is no live output to follow")
	}
	var mu sync.Mutex
	sub, err := nc.Subscribe(wc.Events+"."+id, func(m *nats.Msg) {
		var ev Event
		if json.Unmarshal(m.Data, &ev) == nil {
			mu.Lock()
			io.WriteString(w, ev.Data)
			mu.Unlock()
		}
	})
	if err != nil {
		return nil, fmt.Errorf("following task %s: %w", id, err)
	}
	// The subscription is in place before the task is published.
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("following task %s: %w", id, err)
	}
	return sub, nil
}

// ErrNoResult is returned by Get for an id without a result (yet).
var ErrNoResult = errors.New("no result (yet)")

// Get is the stored result of id.
func Get(ctx context.Context, kv jetstream.KeyValue, id string) (*result.Result, error) {
	if err := task.CheckID(id); err != nil {
		return nil, fmt.Errorf("task id %w", err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("task %s: %w", id, ErrNoResult)
	}
	if err != nil {
		return nil, fmt.Errorf("task %s: reading its result: %w", id, err)
	}
	return decode(id, e.Value())
}

// Wait waits until the result of id is stored, or ctx is done.
func Wait(ctx context.Context, kv jetstream.KeyValue, id string) (*result.Result, error) {
	if err := task.CheckID(id); err != nil {
		return nil, fmt.Errorf("task id %w", err)
	}
	wt, err := kv.Watch(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("task %s: watching for its result: %w", id, err)
	}
	defer wt.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("task %s: waiting for its result: %w", id, ctx.Err())
		case e, ok := <-wt.Updates():
			if !ok {
				return nil, fmt.Errorf("task %s: watching for its result: the watch ended", id)
			}
			// nil marks the end of the values stored before the watch.
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				return decode(id, e.Value())
			}
		}
	}
}

func decode(id string, b []byte) (*result.Result, error) {
	res := &result.Result{}
	if err := json.Unmarshal(b, res); err != nil {
		return nil, fmt.Errorf("task %s: its stored result is not a result: %w", id, err)
	}
	return res, nil
}
