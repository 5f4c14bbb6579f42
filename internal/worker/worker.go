package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// Worker takes tasks from the stream and runs them, at most Slots at once.
type Worker struct {
	cfg     *config.Config
	wc      config.Worker
	run     runapi.Func
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	cons    jetstream.Consumer
	kv      jetstream.KeyValue
	slots   int
	ackWait time.Duration
	retry   time.Duration
	hook    *approvals.Webhook // nil without worker.approvals.webhook
	// Logf reports what the worker does not answer on the bus (a message
	// it cannot use, a result it could not store).
	Logf func(format string, args ...any)
}

// fetchWait is how long one pull request waits for tasks. A free slot is
// taken up by the next pull, so it also bounds how long a slot stays idle
// while tasks wait, and how long SIGTERM waits for the fetching to stop.
const fetchWait = time.Second

// storeFor bounds the retries of storing a result while NATS is away. The
// task is kept alive meanwhile; past this it goes back to the stream.
const storeFor = 2 * time.Minute

// New connects to NATS, makes sure the stream, the results bucket and the
// shared consumer are there (creating what is missing) and returns a
// worker that runs tasks with run under cfg's policy.
func New(ctx context.Context, cfg *config.Config, run runapi.Func, name string) (*Worker, error) {
	wc := cfg.Worker
	w := &Worker{cfg: cfg, wc: wc, run: run, slots: wc.Slots, Logf: func(string, ...any) {}}
	if w.slots == 0 {
		w.slots = cfg.Server.MaxConcurrent
	}
	w.ackWait, w.retry = wc.AckWait.Duration(), wc.RetryDelay.Duration()
	var err error
	if w.nc, err = Connect(wc, name); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			w.nc.Close()
		}
	}()
	if w.js, err = jetstream.New(w.nc); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if w.stream, err = EnsureStream(ctx, w.js, wc); err != nil {
		return nil, err
	}
	if w.kv, err = EnsureBucket(ctx, w.js, wc); err != nil {
		return nil, err
	}
	w.cons, err = w.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       Consumer,
		FilterSubject: wc.Subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.ackWait,
		MaxDeliver:    wc.MaxDeliver,
		// Never more tasks out than the workers could hold at once; a
		// worker asks for no more than its free slots anyway.
		MaxAckPending: 10000,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", Consumer, wc.Stream, err)
	}
	if wc.Approvals.Webhook != "" {
		w.hook = approvals.NewWebhook()
		w.hook.Logf = func(format string, args ...any) { w.Logf(format, args...) }
	}
	ok = true
	return w, nil
}

// Slots is the number of tasks the worker runs at once.
func (w *Worker) Slots() int { return w.slots }

// Run takes and runs tasks until stop is done, then stops fetching, lets
// the tasks running finish within grace, kills those still running after
// it (their messages go back to the stream at once) and closes the
// connection once every result is stored and acked. The connection is
// closed when Run returns.
func (w *Worker) Run(stop context.Context, grace time.Duration) error {
	defer w.nc.Close()
	if w.hook != nil {
		defer w.hook.Close()
	}
	adv, err := w.nc.Subscribe(fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", w.wc.Stream, Consumer), w.maxDeliveries)
	if err != nil {
		return fmt.Errorf("subscribing to max-deliveries advisories: %w", err)
	}
	defer adv.Unsubscribe()

	runCtx, kill := context.WithCancel(context.Background())
	defer kill()
	free := make(chan struct{}, w.slots)
	for range w.slots {
		free <- struct{}{}
	}
	var wg sync.WaitGroup
	for stop.Err() == nil {
		// Wait for one free slot, then take every other free one.
		select {
		case <-stop.Done():
			continue
		case <-free:
		}
		n := 1
	take:
		for n < w.slots {
			select {
			case <-free:
				n++
			default:
				break take
			}
		}
		batch, err := w.cons.Fetch(n, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			for range n {
				free <- struct{}{}
			}
			w.Logf("fetching tasks: %v", err)
			select {
			case <-stop.Done():
			case <-time.After(fetchWait):
			}
			continue
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { free <- struct{}{} }()
				w.handle(runCtx, msg)
			}()
		}
		for range n - got {
			free <- struct{}{}
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		w.Logf("tasks still running after %s: killing them", grace)
		kill()
		<-done
	}
	// Acks were confirmed by the server; what is left to send are the
	// last live-output events.
	if err := w.nc.FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("flushing the NATS connection: %w", err)
	}
	return nil
}

// handle runs one delivered task and answers the message.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.Logf("message without metadata: %v", err)
		_ = msg.Term()
		return
	}
	id := msg.Headers().Get(IDHeader)
	if err := task.CheckID(id); err != nil {
		// No id, no place for a result: nobody can be waiting for it.
		w.Logf("message %d: header %s %v: dropped", meta.Sequence.Stream, IDHeader, err)
		_ = msg.Term()
		return
	}
	if _, err := w.kv.Get(ctx, id); err == nil {
		// A result is stored: an earlier delivery ran it and its ack was
		// lost. Never run a task twice for nothing.
		_ = msg.Ack()
		return
	}

	plan, err := task.Load(msg.Data(), w.cfg)
	if err == nil && plan.ID != "" && plan.ID != id {
		err = &task.Error{Field: "id", Reason: fmt.Sprintf("%q is not the message's %s %q", plan.ID, IDHeader, id)}
	}
	if err != nil {
		// A bad task or a policy refusal: the answer, never retried.
		w.finish(ctx, msg, id, result.NotRun(err))
		return
	}

	alive, stopAlive := context.WithCancel(context.Background())
	go w.keepAlive(alive, msg)
	res := w.run(ctx, plan, runapi.Hooks{Output: w.output(id), Approve: w.approver(plan.Session)})
	if res.Error != "" {
		switch {
		case ctx.Err() != nil:
			// Killed at shutdown: another worker runs it now.
			stopAlive()
			_ = msg.Nak()
			return
		case errkind.Of(res.Err) == errkind.NotFound:
			// keep_workspace on a session that does not exist: the
			// task's fault, the same on every host: its answer, never
			// retried.
			w.finish(ctx, msg, id, res)
			stopAlive()
			return
		case int(meta.NumDelivered) < w.wc.MaxDeliver:
			// A host failure: maybe this host's only; back off and let
			// another worker try.
			stopAlive()
			_ = msg.NakWithDelay(w.retry * time.Duration(meta.NumDelivered))
			return
		}
		res.Error = fmt.Sprintf("failed on each of %d deliveries (max_deliver), the last with: %s", meta.NumDelivered, res.Error)
	}
	w.finish(ctx, msg, id, res)
	stopAlive()
}

// finish stores res as the result of id and then acks msg. A result that
// cannot be stored leaves the message unacked: it comes back.
func (w *Worker) finish(ctx context.Context, msg jetstream.Msg, id string, res *result.Result) {
	if err := w.store(id, res); err != nil {
		w.Logf("task %s: storing its result: %v", id, err)
		_ = msg.Nak()
		return
	}
	// An ack lost on the way (NATS away) redelivers the task, and the next
	// delivery finds the result.
	if err := msg.DoubleAck(context.WithoutCancel(ctx)); err != nil {
		w.Logf("task %s: ack: %v", id, err)
	}
}

// store creates the result of id, retrying while NATS is away, for at
// most storeFor. A result already there (another delivery's) is kept.
func (w *Worker) store(id string, res *result.Result) error {
	data, err := Encode(res, w.nc.MaxPayload())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(storeFor)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = w.kv.Create(ctx, id, data)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrKeyExists) {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
	}
}

// keepAlive tells the server the task is still running, three times per
// ack_wait, until ctx is done. Failures (NATS away) are retried at the
// next tick.
func (w *Worker) keepAlive(ctx context.Context, msg jetstream.Msg) {
	t := time.NewTicker(w.ackWait / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = msg.InProgress()
		}
	}
}

// Event is one live output chunk of a task, published on EVENTS.ID.
type Event struct {
	Stream string `json:"stream"` // stdout or stderr
	Data   string `json:"data"`
}

// output publishes the program's output on the task's event subject, at
// most once per chunk the runner keeps (so at most output_bytes per
// stream), best effort.
func (w *Worker) output(id string) runapi.OutputFunc {
	if w.wc.Events == "" {
		return nil
	}
	subject := w.wc.Events + "." + id
	return func(stream string, data []byte) {
		b, err := json.Marshal(Event{Stream: stream, Data: string(data)})
		if err == nil {
			_ = w.nc.Publish(subject, b)
		}
	}
}

// advisory is the part of JetStream's max-deliveries advisory used here.
type advisory struct {
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// maxDeliveries answers a task whose every delivery ended without an ack
// (the workers holding it died): it gets an error result and leaves the
// stream. Every worker hears the advisory; the first result wins.
func (w *Worker) maxDeliveries(m *nats.Msg) {
	var a advisory
	if err := json.Unmarshal(m.Data, &a); err != nil || a.StreamSeq == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := w.stream.GetMsg(ctx, a.StreamSeq)
	if err != nil {
		return // already answered and removed
	}
	id := raw.Header.Get(IDHeader)
	if task.CheckID(id) == nil {
		err := fmt.Errorf("delivered %d times (max_deliver) and never answered: the workers that took it stopped before it ended", a.Deliveries)
		if err := w.store(id, result.NotRun(err)); err != nil {
			w.Logf("task %s: storing its result: %v", id, err)
			return
		}
	}
	_ = w.stream.DeleteMsg(ctx, a.StreamSeq)
}
