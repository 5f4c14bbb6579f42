package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/agentrun/agentrun/internal/runapi"
)

// The live sandboxes' side of Client: each call is one of the routes of
// sandboxes.go. A refusal is a *runapi.Refusal, by its status's kind.

// maxEventLine bounds one NDJSON event read back: an output event
// carries at most 32 KiB, which JSON's escapes grow at most sixfold.
const maxEventLine = 1 << 20

// maxControlAnswer bounds the answer of a call that is not a stream or a
// file: a sandbox, a list of them or of processes.
const maxControlAnswer = 4 << 20

// CreateSandbox makes a live sandbox of req's shape.
func (c *Client) CreateSandbox(ctx context.Context, req SandboxRequest) (runapi.SandboxInfo, error) {
	var info runapi.SandboxInfo
	err := c.call(ctx, http.MethodPost, "/v1/sandboxes", req, http.StatusCreated, &info)
	return info, err
}

// Sandboxes lists the caller's live sandboxes.
func (c *Client) Sandboxes(ctx context.Context) ([]runapi.SandboxInfo, error) {
	var list struct {
		Sandboxes []runapi.SandboxInfo `json:"sandboxes"`
	}
	err := c.call(ctx, http.MethodGet, "/v1/sandboxes", nil, http.StatusOK, &list)
	return list.Sandboxes, err
}

// DeleteSandbox ends sandbox id: everything in it is gone once it
// returns.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, http.StatusNoContent, nil)
}

// Processes lists sandbox id's processes, running and recently ended.
func (c *Client) Processes(ctx context.Context, id string) ([]runapi.ProcessInfo, error) {
	var list struct {
		Processes []runapi.ProcessInfo `json:"processes"`
	}
	err := c.call(ctx, http.MethodGet, sandboxPath(id)+"/processes", nil, http.StatusOK, &list)
	return list.Processes, err
}

// Exec runs req in sandbox id, calling on with each of its events as
// they come, until its exit (returned) or on's error.
func (c *Client) Exec(ctx context.Context, id string, req ProcessRequest, on func(runapi.ProcessEvent) error) (runapi.ProcessEvent, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return runapi.ProcessEvent{}, err
	}
	return c.stream(ctx, http.MethodPost, sandboxPath(id)+"/processes", body, on)
}

// Start starts req in sandbox id and returns its pid at once; it runs on.
func (c *Client) Start(ctx context.Context, id string, req ProcessRequest) (int, error) {
	var started struct {
		Pid int `json:"pid"`
	}
	err := c.call(ctx, http.MethodPost, sandboxPath(id)+"/processes?wait=false", req, http.StatusOK, &started)
	return started.Pid, err
}

// Attach calls on with the events of process pid of sandbox id: the
// tail it kept, then those to come, until its exit (returned) or on's
// error.
func (c *Client) Attach(ctx context.Context, id string, pid int, on func(runapi.ProcessEvent) error) (runapi.ProcessEvent, error) {
	return c.stream(ctx, http.MethodGet, processPath(id, pid)+"/events", nil, on)
}

// WriteStdin writes data (at most MaxStdinBytes) to process pid's
// stdin, closing it after if close is set.
func (c *Client) WriteStdin(ctx context.Context, id string, pid int, data []byte, close bool) error {
	req := StdinRequest{Close: close}
	if utf8.Valid(data) {
		req.Data = string(data)
	} else {
		req.DataB64 = base64.StdEncoding.EncodeToString(data)
	}
	return c.call(ctx, http.MethodPost, processPath(id, pid)+"/stdin", req, http.StatusNoContent, nil)
}

// Signal sends the signal named sig (SIGINT, TERM…) to process pid.
func (c *Client) Signal(ctx context.Context, id string, pid int, sig string) error {
	return c.call(ctx, http.MethodPost, processPath(id, pid)+"/signal", map[string]string{"signal": sig}, http.StatusNoContent, nil)
}

// Resize sets the size of process pid's pseudo-terminal.
func (c *Client) Resize(ctx context.Context, id string, pid int, size TTYSize) error {
	return c.call(ctx, http.MethodPost, processPath(id, pid)+"/resize", size, http.StatusNoContent, nil)
}

func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

func processPath(id string, pid int) string {
	return sandboxPath(id) + "/processes/" + strconv.Itoa(pid)
}

// call sends method path with in as its JSON body (none if nil), and
// decodes the answer into out (if not nil) when its status is want;
// another status is a refusal.
func (c *Client) call(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxControlAnswer))
	if err != nil {
		return fmt.Errorf("reading the server's answer: %w", err)
	}
	if resp.StatusCode != want {
		return answerRefusal(resp, data, "the request")
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("the server's answer to %s %s is not what it should be: %w", method, path, err)
	}
	return nil
}

// stream sends method path and calls on with each NDJSON event of its
// answer until the exit event, which it returns.
func (c *Client) stream(ctx context.Context, method, path string, body []byte, on func(runapi.ProcessEvent) error) (runapi.ProcessEvent, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	resp, err := c.do(ctx, method, path, r)
	if err != nil {
		return runapi.ProcessEvent{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxControlAnswer))
		return runapi.ProcessEvent{}, answerRefusal(resp, data, "the process")
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxEventLine)
	for sc.Scan() {
		var ev runapi.ProcessEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return runapi.ProcessEvent{}, fmt.Errorf("the server's event is not one: %w", err)
		}
		if ev.Event == "exit" {
			return ev, nil
		}
		if on != nil {
			if err := on(ev); err != nil {
				return runapi.ProcessEvent{}, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return runapi.ProcessEvent{}, fmt.Errorf("reading the process's events: %w", err)
	}
	return runapi.ProcessEvent{}, fmt.Errorf("the process's events ended before its exit")
}

// answerRefusal is the refusal of what the server answered with a status
// that is not the one wanted, data its body.
func answerRefusal(resp *http.Response, data []byte, what string) error {
	var apiErr APIError
	if json.Unmarshal(data, &apiErr) != nil || apiErr.Error == "" {
		return fmt.Errorf("the server answered %s", resp.Status)
	}
	return &runapi.Refusal{Why: statusKind(resp.StatusCode), Field: apiErr.Field,
		Msg: fmt.Sprintf("the server refused %s (%d): %s", what, resp.StatusCode, apiErr.Error)}
}
