package approvals

// The webhook announces holds to the operator: a JSON Hold, signed with
// HMAC-SHA256, POSTed in the background with bounded time and retries.
// The decision comes back another way (serve's API or page, NATS for a
// worker); a webhook that fails leaves the request held until its
// approval timeout.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/secret"
)

// Hold is a request held for a decision as the webhook receives it. The
// fields the program controls (Method, URL, BodyExcerpt; Tool, Arguments)
// are the proxy's or the tool broker's escaped text (untrusted.Text;
// docs/services.md): shown as they are, they draw nothing but themselves
// on a terminal; a page still escapes them for HTML. A held tool call
// (Kind "tool", docs/tools.md) has Service the tool server's name, Tool
// and Arguments (JSON, whole), and Method, URL and BodyExcerpt empty.
type Hold struct {
	Run         string `json:"run"`
	ID          string `json:"id"`
	Service     string `json:"service"`
	Method      string `json:"method"`
	URL         string `json:"url"`
	BodyExcerpt string `json:"body_excerpt"`
	// BodyCut is set when the body is longer than BodyExcerpt, which
	// then holds its first bytes only (Approval.BodyCut).
	BodyCut   bool      `json:"body_cut"`
	Session   string    `json:"session"`
	ExpiresAt time.Time `json:"expires_at"`
	// Kind, Tool and Arguments are Approval's: Kind "tool" for a
	// held tool call, absent for a request.
	Kind      string `json:"kind,omitempty"`
	Tool      string `json:"tool,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// NewHold is the Hold of approval a of run, in session, that waits until
// ctx's deadline.
func NewHold(ctx context.Context, run, session string, a Approval) Hold {
	h := Hold{Run: run, ID: a.ID, Service: a.Service, Method: a.Method, URL: a.URL,
		BodyExcerpt: a.BodyExcerpt, BodyCut: a.BodyCut, Session: session,
		Kind: a.Kind, Tool: a.Tool, Arguments: a.Arguments}
	if d, ok := ctx.Deadline(); ok {
		h.ExpiresAt = d.UTC().Truncate(time.Millisecond)
	}
	return h
}

// SignatureHeader carries the body's signature: "sha256=" and the hex
// HMAC-SHA256 of the exact body bytes with the webhook's secret.
const SignatureHeader = "X-Agentrun-Signature"

// Sign is the value of SignatureHeader for body signed with secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Target is where holds are sent: the webhook's URL (http or https) and
// the root-only file of its secret (read at each send, as a service's
// credentials are, so that it can be replaced).
type Target struct {
	URL        string
	SecretFile string
}

// Bounds of the sending. Variables for the tests.
var (
	// attemptTimeout bounds one POST, from the connection to the status.
	attemptTimeout = 5 * time.Second
	// attempts is how many POSTs a hold gets before it is given up on.
	attempts = 3
	// backoff is the wait after the first failed attempt, doubled after
	// each next one.
	backoff = time.Second
)

// queueSize bounds the holds waiting to be sent, runQueue those of one
// run: the holds of runs are sent in turn, one of each run at a time, so
// that a run that holds many requests delays only its own. senders is how
// many are sent at once, so that one slow webhook delays the others only
// when that many are slow.
const (
	queueSize = 256
	runQueue  = 16
	senders   = 4
)

// Webhook sends holds in the background, never blocking its caller. Make
// it with NewWebhook; Close stops it.
type Webhook struct {
	client *http.Client
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	// Logf gets each hold given up on and why; set before the first Send.
	Logf func(format string, args ...any)

	// work holds a token for each hold queued (at most, once holds
	// withdrawn are dropped): a sender takes one, then the next hold.
	work chan struct{}

	mu     sync.Mutex
	queues map[string][]job // by run, oldest first; a run is here while in turn
	turn   []string         // the runs with holds queued (or none left), next first
	queued int              // holds in queues
}

type job struct {
	ctx context.Context // ends when the request is no longer held
	t   Target
	h   Hold
}

// NewWebhook starts the senders.
func NewWebhook() *Webhook {
	w := &Webhook{
		client: &http.Client{
			// The webhook is the operator's own URL; a redirect from it is
			// not followed (its 3xx is a failure).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: senders,
				TLSHandshakeTimeout: attemptTimeout, ResponseHeaderTimeout: attemptTimeout,
				IdleConnTimeout: time.Minute},
		},
		work:   make(chan struct{}, queueSize),
		queues: map[string][]job{},
		stop:   make(chan struct{}),
		Logf:   func(string, ...any) {},
	}
	for range senders {
		w.wg.Add(1)
		go w.send()
	}
	return w
}

// Send queues h for t and returns at once; false when the queue is full,
// or h's run has runQueue holds queued already (the hold is not
// announced, and waits for its timeout all the same). ctx is the hold's:
// once it ends (the request was decided, timed out or withdrawn) h is
// dropped from the queue, or its sending cut short.
func (w *Webhook) Send(ctx context.Context, t Target, h Hold) bool {
	select {
	case <-w.stop:
		return false
	default:
	}
	w.mu.Lock()
	q, inTurn := w.queues[h.Run]
	if inTurn {
		q = w.live(q)
		w.queues[h.Run] = q
	}
	full := ""
	switch {
	case len(q) >= runQueue:
		full = fmt.Sprintf("its run's share of the webhook queue full (%d)", runQueue)
	case w.queued >= queueSize:
		w.dropWithdrawn()
		if w.queued >= queueSize {
			full = fmt.Sprintf("webhook queue full (%d)", queueSize)
		}
	}
	if full != "" {
		w.mu.Unlock()
		w.Logf("approval %s of run %s: %s: not announced", h.ID, h.Run, full)
		return false
	}
	if _, inTurn = w.queues[h.Run]; !inTurn { // or dropped just now, with none left
		w.turn = append(w.turn, h.Run)
		q = nil
	}
	w.queues[h.Run] = append(q, job{ctx, t, h})
	w.queued++
	w.mu.Unlock()
	select {
	case w.work <- struct{}{}:
	default: // as many tokens as holds queued already
	}
	return true
}

// live returns q, a run's queue, without the holds withdrawn. Under mu.
func (w *Webhook) live(q []job) []job {
	kept := q[:0]
	for _, j := range q {
		if j.ctx.Err() == nil {
			kept = append(kept, j)
		}
	}
	w.queued -= len(q) - len(kept)
	clear(q[len(kept):])
	return kept
}

// dropWithdrawn drops every hold withdrawn from the queues, and the runs
// left with none from the turn. Under mu.
func (w *Webhook) dropWithdrawn() {
	turn := w.turn[:0]
	for _, run := range w.turn {
		kept := w.live(w.queues[run])
		if len(kept) == 0 {
			delete(w.queues, run)
			continue
		}
		w.queues[run] = kept
		turn = append(turn, run)
	}
	clear(w.turn[len(turn):])
	w.turn = turn
}

// next takes the oldest hold of the run whose turn it is, skipping the
// holds withdrawn; false when none waits.
func (w *Webhook) next() (job, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.turn) > 0 {
		run := w.turn[0]
		w.turn = w.turn[1:]
		q := w.queues[run]
		if len(q) == 0 {
			delete(w.queues, run)
			continue
		}
		j := q[0]
		q[0] = job{}
		if q = q[1:]; len(q) > 0 {
			w.queues[run] = q
			w.turn = append(w.turn, run)
		} else {
			delete(w.queues, run)
		}
		w.queued--
		if j.ctx.Err() == nil {
			return j, true
		}
	}
	return job{}, false
}

// Close stops the senders: what is being sent is cut short, what waits in
// the queue is dropped.
func (w *Webhook) Close() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
	w.client.CloseIdleConnections()
}

func (w *Webhook) send() {
	defer w.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-w.stop
		cancel()
	}()
	for {
		select {
		case <-w.stop:
			return
		case <-w.work:
		}
		for {
			j, ok := w.next()
			if !ok {
				break
			}
			jctx, jcancel := context.WithCancel(ctx)
			stop := context.AfterFunc(j.ctx, jcancel)
			if err := w.deliver(jctx, j.t, j.h); err != nil {
				w.Logf("approval %s of run %s: webhook %s: %v", j.h.ID, j.h.Run, endpoint.Redact(j.t.URL), err)
			}
			stop()
			jcancel()
		}
	}
}

// deliver POSTs h to t, retrying with backoff, never past h's expiry.
func (w *Webhook) deliver(ctx context.Context, t Target, h Hold) error {
	if !h.ExpiresAt.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, h.ExpiresAt)
		defer cancel()
	}
	body, err := json.Marshal(h)
	if err != nil {
		return err
	}
	wait := backoff
	for i := 1; ; i++ {
		err = w.post(ctx, t, body)
		if err == nil {
			return nil
		}
		if i >= attempts {
			return fmt.Errorf("gave up after %d attempts: %w", i, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after %d attempts (the request is no longer held): %w", i, err)
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// post makes one attempt; a 2xx answer is success.
func (w *Webhook) post(ctx context.Context, t Target, body []byte) error {
	key, err := secret.Read(t.SecretFile)
	if err != nil {
		return fmt.Errorf("webhook_secret_file %s: %w", t.SecretFile, err)
	}
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return redactErr(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "agentrun")
	req.Header.Set(SignatureHeader, Sign([]byte(key), body))
	resp, err := w.client.Do(req)
	if err != nil {
		return redactErr(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// redactErr is err, an error of net/http's, with the URL a *url.Error
// names whole shown as endpoint.Redact does.
func redactErr(err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	return &url.Error{Op: ue.Op, URL: endpoint.Redact(ue.URL), Err: redactErr(ue.Err)}
}

// CheckSecret reads a webhook's secret file, when one is configured, as
// each send will: root's alone, not empty. field is the config section
// it is set in ("server.approvals", "worker.approvals").
func CheckSecret(field, file string) error {
	if file == "" {
		return nil
	}
	if _, err := secret.Read(file); err != nil {
		return fmt.Errorf("%s.webhook_secret_file %s: %w", field, file, err)
	}
	return nil
}
