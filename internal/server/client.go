package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// Client runs tasks on an agentrun server.
type Client struct {
	base  string // http://host[:port]
	token string
	http  *http.Client
}

// NewClient returns a client for the server listening on addr
// (unix:///path or tcp://host:port, as server.listen), sending token as a
// bearer token when it is not "".
func NewClient(addr, token string) (*Client, error) {
	c := &Client{token: token}
	a, err := config.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("server address %w", err)
	}
	switch a.Network {
	case "unix":
		// The Host "agentrun": serve's name on its unix socket.
		c.base = "http://agentrun"
		c.http = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", a.Address)
		}}}
	default:
		c.base = "http://" + a.Address
		c.http = &http.Client{}
	}
	return c, nil
}

// Retries of a refusal that says when to try again (429 over a session
// quota, 503 server busy): at most MaxRetries, each after the server's
// Retry-After when that is at most MaxRetryWait. Variables for the tests.
var (
	MaxRetries   = 5
	MaxRetryWait = 30 * time.Second
)

// Run sends the task (task.json bytes) and returns its result. A result
// with Error set (the server could not run the task) is returned as is; a
// refusal (bad task, over policy or quota, server busy) is a *runapi.Refusal, and
// a server that cannot be reached another error. A 429 or 503 is tried
// again after its Retry-After, a bounded number of times (see MaxRetries).
func (c *Client) Run(ctx context.Context, taskJSON []byte) (*result.Result, error) {
	if len(taskJSON) > task.MaxTaskBytes {
		return nil, fmt.Errorf("task is %d bytes, more than the maximum %d", len(taskJSON), task.MaxTaskBytes)
	}
	for tries := 0; ; tries++ {
		res, wait, err := c.runOnce(ctx, taskJSON)
		if wait < 0 || tries >= MaxRetries {
			return res, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up waiting to try again: %w)", err, ctx.Err())
		case <-t.C:
		}
	}
}

// runOnce sends the task once. wait >= 0 when the refusal may be tried
// again after wait.
func (c *Client) runOnce(ctx context.Context, taskJSON []byte) (_ *result.Result, wait time.Duration, _ error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/runs", bytes.NewReader(taskJSON))
	if err != nil {
		return nil, -1, err
	}
	defer resp.Body.Close()
	// A result is bounded by the task's output and collect caps.
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return nil, -1, fmt.Errorf("reading the server's answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusInternalServerError:
		var res result.Result
		if err := json.Unmarshal(body, &res); err != nil {
			return nil, -1, fmt.Errorf("the server's answer (status %d) is not a result: %w", resp.StatusCode, err)
		}
		return &res, -1, nil
	}
	wait = -1
	err = answerRefusal(resp, body, "the task")
	ref, ok := err.(*runapi.Refusal)
	if !ok {
		return nil, wait, err
	}
	if retry := resp.Header.Get("Retry-After"); retry != "" {
		ref.Msg += " (retry after " + retry + "s)"
		if n, err := strconv.Atoi(retry); err == nil && n >= 0 {
			ref.RetryAfter = time.Duration(n) * time.Second
			if ref.RetryAfter <= MaxRetryWait && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
				wait = ref.RetryAfter
			}
		}
	}
	return nil, wait, ref
}

// Health asks the server how it is (GET /healthz).
func (c *Client) Health(ctx context.Context) (*Health, error) {
	resp, err := c.do(ctx, http.MethodGet, "/healthz", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the server answered %s", resp.Status)
	}
	var h Health
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&h); err != nil {
		return nil, fmt.Errorf("the server's health is not JSON: %w", err)
	}
	return &h, nil
}

// HTTP returns the URL of path on the server and an HTTP client that
// reaches it with the token: for another protocol served on the same
// socket (/mcp).
func (c *Client) HTTP(path string) (string, *http.Client) {
	hc := *c.http
	hc.Transport = &withToken{base: hc.Transport, token: c.token}
	return c.base + path, &hc
}

// withToken adds the bearer token, if any, to each request.
type withToken struct {
	base  http.RoundTripper // nil: http.DefaultTransport
	token string
}

func (t *withToken) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	if t.token == "" {
		return base.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+t.token)
	return base.RoundTrip(req)
}

// do sends one request, with the token.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reaching the server: %w", err)
	}
	return resp, nil
}

// maxAnswerBytes bounds a result read back: output and collected files
// are capped by the policy, JSON and base64 grow them by a third or so.
const maxAnswerBytes = 256 << 20
