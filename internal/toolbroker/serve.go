package toolbroker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/jsonkeys"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/untrusted"
)

// bodySlack is what a call's body may hold beyond its arguments: the
// server's and the tool's names and the JSON around them.
const bodySlack = 4 << 10

// Outcomes of a call, the values of the metrics' outcome label.
const (
	OutcomeAnswered = "answered" // the server answered (isError or not)
	OutcomeRefused  = "refused"  // a rule, a bound or a denial refused it
	OutcomeFailed   = "failed"   // the server failed, timed out or answered too much
)

// callRequest is the body of POST /v1/call.
type callRequest struct {
	Server    string          `json:"server"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
}

// callError is a call's refusal or failure: the status and message the
// program gets, and the outcome it counts as.
type callError struct {
	status  int
	msg     string
	outcome string
}

func (e *callError) Error() string { return e.msg }

func refused(status int, format string, args ...any) *callError {
	return &callError{status: status, msg: fmt.Sprintf(format, args...), outcome: OutcomeRefused}
}

func failed(status int, format string, args ...any) *callError {
	return &callError{status: status, msg: fmt.Sprintf(format, args...), outcome: OutcomeFailed}
}

// listedTool is one tool of GET /v1/tools.
type listedTool struct {
	Server      string `json:"server"`
	Name        string `json:"name"`
	Description string `json:"description"`
	InputSchema any    `json:"input_schema"`
}

// tracked serves a request of the program with serve while the broker is
// open, counted among the calls Close waits for, under the call's context
// (callContext).
func (b *Broker) tracked(serve func(ctx context.Context, w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !b.enter() {
			writeError(w, http.StatusServiceUnavailable, "the run's tool broker is closed")
			return
		}
		defer b.calls.Done()
		ctx, cancel := b.callContext(r.Context())
		defer cancel()
		serve(ctx, w, r)
	}
}

// serveTools answers GET /v1/tools: the tools of the run's servers that
// some rule allows. A server that cannot be listed is left out and named
// in "errors".
func (b *Broker) serveTools(ctx context.Context, w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Tools  []listedTool      `json:"tools"`
		Errors map[string]string `json:"errors,omitempty"`
	}{Tools: []listedTool{}}
	for _, name := range b.order {
		rs := b.servers[name]
		tools, err := b.list(ctx, rs)
		if err != nil {
			if out.Errors == nil {
				out.Errors = map[string]string{}
			}
			out.Errors[name] = err.Error()
			continue
		}
		out.Tools = append(out.Tools, tools...)
	}
	writeJSON(w, http.StatusOK, out)
}

// list is rs's tools that a rule allows, listed once for the run (the
// first list connects to the server: that is its start), within
// MaxListedTools and MaxListBytes.
func (b *Broker) list(ctx context.Context, rs *runServer) ([]listedTool, error) {
	rs.listOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, b.limits.CallTimeout)
		defer cancel()
		cs, err := rs.conn.session(ctx)
		if err != nil {
			rs.listErr = err
			return
		}
		size := 0
		for t, err := range cs.Tools(ctx, nil) {
			if err != nil {
				rs.listErr = fmt.Errorf("listing the tools of tool server %s: %w", rs.srv.Name, cut(err))
				return
			}
			if len(rs.tools) == MaxListedTools || size > MaxListBytes {
				b.opts.Logf("toolbroker: run %s: tool server %s lists more than %d tools or %d bytes; the rest left out", b.opts.Run, rs.srv.Name, MaxListedTools, MaxListBytes)
				break
			}
			if _, ok := rs.srv.rule(t.Name); !ok {
				continue
			}
			lt := listedTool{Server: rs.srv.Name, Name: t.Name, Description: t.Description, InputSchema: t.InputSchema}
			j, _ := json.Marshal(lt)
			size += len(j)
			rs.tools = append(rs.tools, lt)
		}
	})
	return rs.tools, rs.listErr
}

// rule is the first rule whose glob matches the tool's name.
func (s Server) rule(tool string) (Rule, bool) {
	for _, r := range s.Rules {
		for _, g := range r.Tools {
			if ok, _ := path.Match(g, tool); ok {
				return r, true
			}
		}
	}
	return Rule{}, false
}

// enter counts a request in flight, unless the broker is closed.
func (b *Broker) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.calls.Add(1)
	return true
}

// callContext is ctx (the program's request: it ends when the program
// hangs up) ended too by Close.
func (b *Broker) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// serveCall answers POST /v1/call with the server's CallToolResult, or
// the call's refusal or failure; it records the call either way.
func (b *Broker) serveCall(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := result.ToolCall{}
	toolLabel := "-"
	var body []byte
	req, cerr := b.readCall(r, &rec)
	if cerr == nil {
		body, cerr = b.call(ctx, req, &rec, &toolLabel)
	}
	rec.DurationMS = time.Since(start).Milliseconds()
	outcome := OutcomeAnswered
	if cerr != nil {
		outcome, rec.Reason = cerr.outcome, cerr.msg
	}
	b.record(rec, outcome, toolLabel)
	if cerr != nil {
		writeError(w, cerr.status, cerr.msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// readCall reads and checks the call's body: bounded, one JSON object
// whose arguments are an object no longer than Limits.ArgumentBytes, and
// no object in it, the arguments' or their values', holding a key twice
// (jsonkeys.Check). Its
// Arguments are then as they will be sent (sentArguments). It fills in
// rec's server, tool and arguments' SHA-256.
func (b *Broker) readCall(r *http.Request, rec *result.ToolCall) (*callRequest, *callError) {
	limit := b.limits.ArgumentBytes + bodySlack
	raw, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, refused(http.StatusBadRequest, "reading the call: %v", err)
	}
	if int64(len(raw)) > limit {
		return nil, refused(http.StatusRequestEntityTooLarge, "arguments too large: the call is longer than %d bytes (tool_limits.argument_bytes)", b.limits.ArgumentBytes)
	}
	var req callRequest
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || dec.More() {
		return nil, refused(http.StatusBadRequest, "the call is not one JSON object {\"server\", \"tool\", \"arguments\"}")
	}
	rec.Server, rec.Tool = untrusted.Cut(untrusted.Text(req.Server), maxToolName), untrusted.Cut(untrusted.Text(req.Tool), maxToolName)
	if err := jsonkeys.Check(raw); err != nil {
		// Readers disagree on which of two values of a key counts: the
		// approver could be shown one and the tool server read the other.
		return nil, refused(http.StatusBadRequest, "the call is refused: %v", err)
	}
	args, err := sentArguments(req.Arguments)
	if err != nil {
		return nil, refused(http.StatusBadRequest, "arguments: %v", err)
	}
	sum := sha256.Sum256(args)
	rec.ArgumentsSHA256 = hex.EncodeToString(sum[:])
	if int64(len(args)) > b.limits.ArgumentBytes {
		return nil, refused(http.StatusRequestEntityTooLarge, "arguments too large: %d bytes, more than %d (tool_limits.argument_bytes)", len(args), b.limits.ArgumentBytes)
	}
	req.Arguments = args
	return &req, nil
}

// sentArguments is the arguments as the SDK sends them: a JSON object,
// compact and with <, > and & escaped, as encoding/json writes a
// json.RawMessage, so that what is hashed and shown is what is sent.
// Absent arguments are {}.
func sentArguments(raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return []byte("{}"), nil
	}
	if raw[0] != '{' {
		return nil, errors.New("must be a JSON object")
	}
	var compact, escaped bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, errors.New("not valid JSON")
	}
	json.HTMLEscape(&escaped, compact.Bytes())
	return escaped.Bytes(), nil
}

// call rules the call, holds it for a human where the rule says so, and
// makes it; it returns the server's result as JSON.
func (b *Broker) call(ctx context.Context, req *callRequest, rec *result.ToolCall, toolLabel *string) ([]byte, *callError) {
	rs, ok := b.servers[req.Server]
	if !ok {
		return nil, refused(http.StatusNotFound, "unknown tool server %s: the run's are %v", rec.Server, b.order)
	}
	if cerr := b.admit(); cerr != nil {
		return nil, cerr
	}
	select {
	case b.sem <- struct{}{}:
		defer func() { <-b.sem }()
	default:
		return nil, refused(http.StatusTooManyRequests, "too many calls at once: %d in flight (tool_limits.concurrent)", b.limits.Concurrent)
	}
	rule, ok := rs.srv.rule(req.Tool)
	if !ok {
		return nil, refused(http.StatusForbidden, "tool %s of server %s: no rule of the config allows it", rec.Tool, rs.srv.Name)
	}
	*toolLabel = rec.Tool
	if rule.Approve {
		if cerr := b.hold(ctx, rs.srv.Name, req, rec); cerr != nil {
			return nil, cerr
		}
	}
	rec.Allowed = true
	return b.callServer(ctx, rs, req, rec)
}

// admit counts the call against Limits.Calls.
func (b *Broker) admit() *callError {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.made >= b.limits.Calls {
		return refused(http.StatusTooManyRequests, "calls per run spent: %d made (tool_limits.calls)", b.made)
	}
	b.made++
	return nil
}

// hold asks Options.Approve about the call and waits, within the
// approval timeout and the program's request, for the decision.
func (b *Broker) hold(ctx context.Context, server string, req *callRequest, rec *result.ToolCall) *callError {
	a, err := approvals.ToolCall(server, req.Tool, req.Arguments)
	if err != nil {
		return refused(http.StatusForbidden, "%v", err)
	}
	rec.Approval = a.ID
	if b.opts.Approve == nil {
		rec.By = "no way to ask"
		return refused(http.StatusForbidden, "denied by the operator: no way to ask (the call needs approval)")
	}
	d, end := approvals.Ask(ctx, b.opts.Approve, a, b.opts.ApprovalTimeout)
	switch end {
	case approvals.TimedOut:
		rec.By = "timeout"
		return refused(http.StatusForbidden, "approval timed out after %s: denied", approvals.Timeout(b.opts.ApprovalTimeout))
	case approvals.Withdrawn:
		rec.By = "abandoned"
		return refused(http.StatusForbidden, "the call was abandoned while held for approval")
	}
	rec.By = untrusted.Cut(untrusted.Text(d.By), 128)
	if rec.By == "" {
		rec.By = "approver"
	}
	if !d.Approved {
		return refused(http.StatusForbidden, "denied by the operator (%s)", rec.By)
	}
	return nil
}

// callServer makes the call within Limits.CallTimeout and returns the
// SDK's CallToolResult as JSON, within Limits.ResultBytes.
func (b *Broker) callServer(ctx context.Context, rs *runServer, req *callRequest, rec *result.ToolCall) ([]byte, *callError) {
	ctx, cancel := context.WithTimeout(ctx, b.limits.CallTimeout)
	defer cancel()
	cs, err := rs.conn.session(ctx)
	if err != nil {
		return nil, failed(http.StatusBadGateway, "%v", err)
	}
	hits := rs.conn.tooLarge.Load()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: req.Tool, Arguments: req.Arguments})
	switch {
	case err != nil && (errors.Is(err, errTooLarge) || rs.conn.tooLarge.Load() != hits):
		return nil, failed(http.StatusBadGateway, "result too large: tool server %s answered more than %d bytes (tool_limits.result_bytes)", rs.srv.Name, b.limits.ResultBytes)
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, failed(http.StatusGatewayTimeout, "call timed out after %s (tool_limits.call_timeout)", b.limits.CallTimeout)
	case err != nil && ctx.Err() != nil:
		return nil, failed(http.StatusServiceUnavailable, "the call was abandoned (the program hung up, or the run ended)")
	case err != nil:
		return nil, failed(http.StatusBadGateway, "tool server %s: %v", rs.srv.Name, cut(err))
	}
	out, err := json.Marshal(res)
	if err != nil {
		return nil, failed(http.StatusBadGateway, "tool server %s: its result cannot be written as JSON: %v", rs.srv.Name, cut(err))
	}
	if int64(len(out)) > b.limits.ResultBytes {
		return nil, failed(http.StatusBadGateway, "result too large: %d bytes, more than %d (tool_limits.result_bytes)", len(out), b.limits.ResultBytes)
	}
	rec.IsError = res.IsError
	return out, nil
}

// cut is err's message escaped and cut for the program: a server's error
// is its own words.
func cut(err error) error {
	return errors.New(untrusted.Cut(untrusted.Text(err.Error()), 1024))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
