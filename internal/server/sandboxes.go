package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/metrics"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// Live sandboxes (spec §17, docs/sandboxes.md):
//
//	POST|GET /v1/sandboxes, GET|DELETE /v1/sandboxes/ID
//	POST /v1/sandboxes/ID/timeout
//	POST|GET /v1/sandboxes/ID/processes
//	GET  /v1/sandboxes/ID/processes/PID/events
//	POST /v1/sandboxes/ID/processes/PID/stdin, …/signal, …/resize
//	GET|PUT|DELETE /v1/sandboxes/ID/files/PATH (GET …?list=1)

// SandboxRequest is the body of POST /v1/sandboxes (runapi's, shared
// with the other doors).
type SandboxRequest = runapi.SandboxRequest

// ProcessRequest is the body of POST /v1/sandboxes/ID/processes.
type ProcessRequest struct {
	Command []string          `json:"command"`
	Cmd     string            `json:"cmd"`
	Cwd     string            `json:"cwd"`
	Env     map[string]string `json:"env"`
	Stdin   bool              `json:"stdin"`
	TTY     *TTYSize          `json:"tty"`
	Timeout config.Duration   `json:"timeout"`
}

// TTYSize is a pseudo-terminal's size: rows and cols each 1 to
// runapi.MaxTTYSize.
type TTYSize = runapi.TTYSize

// StdinRequest is the body of POST …/processes/PID/stdin: Data (UTF-8)
// or DataB64 (any bytes), then the stdin closed if Close.
type StdinRequest struct {
	Data    string `json:"data"`
	DataB64 string `json:"data_b64"` // base64
	Close   bool   `json:"close"`
}

// Bounds of the sandboxes' small bodies.
const (
	maxControlBody = 64 << 10 // a process, a timeout, a signal
	// MaxStdinBytes bounds one write to a process's stdin (decoded).
	MaxStdinBytes = 1 << 20
	// maxStdinBody is the most its body takes, base64 and JSON around.
	maxStdinBody = MaxStdinBytes*4/3 + 4<<10
)

// callerOf is the user a request acts for: serve has one token, so every
// caller is one user; a sandbox's id is its capability all the same.
func callerOf(*http.Request) string { return "" }

// routeSandboxes adds the live sandboxes' endpoints to mux.
func (s *Server) routeSandboxes(mux *http.ServeMux) {
	mux.HandleFunc("/v1/sandboxes", only(s.sandboxes, http.MethodPost, http.MethodGet))
	mux.HandleFunc("/v1/sandboxes/{id}", s.withSandbox(s.sandbox, http.MethodGet, http.MethodDelete))
	mux.HandleFunc("/v1/sandboxes/{id}/timeout", s.withSandbox(s.sandboxTimeout, http.MethodPost))
	mux.HandleFunc("/v1/sandboxes/{id}/processes", s.withSandbox(s.processes, http.MethodPost, http.MethodGet))
	mux.HandleFunc("/v1/sandboxes/{id}/processes/{pid}/events", s.withProcess(s.processEvents, http.MethodGet))
	mux.HandleFunc("/v1/sandboxes/{id}/processes/{pid}/stdin", s.withProcess(s.processStdin, http.MethodPost))
	mux.HandleFunc("/v1/sandboxes/{id}/processes/{pid}/signal", s.withProcess(s.processSignal, http.MethodPost))
	mux.HandleFunc("/v1/sandboxes/{id}/processes/{pid}/resize", s.withProcess(s.processResize, http.MethodPost))
	mux.HandleFunc("/v1/sandboxes/{id}/files/{path...}", s.withSandbox(s.sandboxFile, http.MethodGet, http.MethodPut, http.MethodDelete))
}

var errNoSandboxes = errkind.New(errkind.NotFound, "live sandboxes are not available on this server")

// withSandbox answers 404 for an id that is none of the caller's, else
// calls h with the sandbox.
func (s *Server) withSandbox(h func(http.ResponseWriter, *http.Request, runapi.Sandbox), methods ...string) http.HandlerFunc {
	return only(func(w http.ResponseWriter, r *http.Request) {
		if s.Sandboxes == nil {
			writeRefusal(w, errNoSandboxes)
			return
		}
		sb := s.Sandboxes.Get(callerOf(r), r.PathValue("id"))
		if sb == nil {
			writeError(w, http.StatusNotFound, "", "no such sandbox (it may have ended)")
			return
		}
		h(w, r, sb)
	}, methods...)
}

// withProcess answers 404 for a pid that is none of the sandbox's
// processes, else calls h with the process.
func (s *Server) withProcess(h func(http.ResponseWriter, *http.Request, runapi.Process), methods ...string) http.HandlerFunc {
	return s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox) {
		pid, err := strconv.Atoi(r.PathValue("pid"))
		var p runapi.Process
		if err == nil {
			p = sb.Process(pid)
		}
		if p == nil {
			writeError(w, http.StatusNotFound, "", "no such process in the sandbox")
			return
		}
		h(w, r, p)
	}, methods...)
}

// readSmall reads r's JSON body, at most limit bytes, through the
// server's body reader (its deadline and budget), into v, strictly:
// unknown fields are refused naming them. An empty body is {}.
func (s *Server) readSmall(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if r.ContentLength > limit {
		return refusal(fmt.Errorf("the body is %d bytes, more than the %d this endpoint takes", r.ContentLength, limit), errkind.TooLarge, "")
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	defer body.free()
	if int64(body.size) > limit {
		return refusal(fmt.Errorf("the body is more than the %d bytes this endpoint takes", limit), errkind.TooLarge, "")
	}
	data := body.bytes()
	if len(strings.TrimSpace(string(data))) == 0 {
		data = []byte("{}")
	}
	if err := config.DecodeStrict(data, v); err != nil {
		var de *config.DecodeError
		if errors.As(err, &de) {
			return &runapi.Refusal{Why: errkind.Invalid, Field: de.Path, Msg: de.Path + ": " + de.Reason}
		}
		return refusal(err, errkind.Invalid, "")
	}
	return nil
}

func (s *Server) sandboxes(w http.ResponseWriter, r *http.Request) {
	if s.Sandboxes == nil {
		writeRefusal(w, errNoSandboxes)
		return
	}
	if r.Method == http.MethodGet {
		list := []runapi.SandboxInfo{}
		for _, sb := range s.Sandboxes.List(callerOf(r)) {
			list = append(list, sb.Info())
		}
		writeJSON(w, http.StatusOK, map[string]any{"sandboxes": list})
		return
	}
	var req SandboxRequest
	if err := s.readSmall(w, r, task.MaxTaskBytes, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	sb, err := s.NewSandbox(r.Context(), &req, callerOf(r))
	if err != nil {
		var fe fieldError
		if errors.As(err, &fe) {
			writeError(w, statusOf(err), fe.Field(), err.Error())
		} else {
			writeRefusal(w, err)
		}
		return
	}
	writeJSON(w, http.StatusCreated, sb.Info())
}

// NewSandbox makes a live sandbox of req for user under the current
// config, as POST /v1/sandboxes does, for the server's other doors (MCP's
// exec_command). It fails with a *runapi.Refusal (past sandboxes.max or
// while serve stops: Unavailable, to be tried again), an error naming the
// task field at fault (an image that cannot be had), or the host's error.
func (s *Server) NewSandbox(ctx context.Context, req *SandboxRequest, user string) (runapi.Sandbox, error) {
	if s.Sandboxes == nil {
		return nil, errNoSandboxes
	}
	cfg := s.cfg.Load()
	plan, lifetime, err := runapi.SandboxPlan(req, cfg)
	if err != nil {
		return nil, err
	}
	// A kept session that does not exist, or is busy, is refused before
	// anything is set up (the runner's lock decides a race).
	if err := s.checkSession(plan); err != nil {
		return nil, refusal(err, errkind.Unknown, "session")
	}
	// Its held tool calls and requests, for its whole life: the door's
	// approver (MCP's elicitation), else serve's page and webhook.
	if runapi.ApproverFrom(ctx) == nil {
		ctx = runapi.WithApprover(ctx, s.approver(cfg, plan.Session, nil))
	}
	ctx = runapi.WithToolCounter(ctx, s.metrics.ToolCalled)
	sb, err := s.Sandboxes.Create(ctx, plan, user, lifetime, cfg.Sandboxes.MaxLifetime.Duration())
	if errors.Is(err, runapi.ErrTooManySandboxes) || errors.Is(err, runapi.ErrSandboxesClosed) {
		ref := refusal(err, errkind.Unavailable, "")
		ref.RetryAfter = time.Second
		return nil, ref
	}
	if errors.Is(err, runapi.ErrSandboxQuota) {
		// The user's own sandboxes: one of them has to end first.
		ref := refusal(err, errkind.Quota, "")
		ref.RetryAfter = time.Second
		return nil, ref
	}
	return sb, err
}

func (s *Server) sandbox(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox) {
	if r.Method == http.MethodDelete {
		if err := sb.Close(); err != nil {
			writeRefusal(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, sb.Info())
}

func (s *Server) sandboxTimeout(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox) {
	var req struct {
		Timeout config.Duration `json:"timeout"`
	}
	if err := s.readSmall(w, r, maxControlBody, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	if !req.Timeout.IsSet() {
		writeError(w, http.StatusBadRequest, "timeout", `want {"timeout": "10m"}: the time it lives from now`)
		return
	}
	if _, err := sb.SetTimeout(req.Timeout.Duration()); err != nil {
		writeRefusal(w, refusal(err, errkind.Unknown, "timeout"))
		return
	}
	writeJSON(w, http.StatusOK, sb.Info())
}

func (s *Server) processes(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox) {
	if r.Method == http.MethodGet {
		writeJSON(w, http.StatusOK, map[string]any{"processes": sb.Processes()})
		return
	}
	wait, ok := queryBool(r, "wait", true)
	if !ok {
		writeError(w, http.StatusBadRequest, "", fmt.Sprintf("wait=%q: want true or false", r.URL.Query().Get("wait")))
		return
	}
	var req ProcessRequest
	if err := s.readSmall(w, r, maxControlBody, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	if req.TTY != nil {
		if err := checkTTYSize(*req.TTY, "tty."); err != nil {
			writeRefusal(w, err)
			return
		}
	}
	p, err := sb.Exec(runapi.ExecRequest{Command: req.Command, Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env,
		Stdin: req.Stdin, TTY: req.TTY, Timeout: req.Timeout.Duration()})
	if err != nil {
		s.metrics.SandboxProcess(metrics.Refused)
		writeRefusal(w, err)
		return
	}
	go func() {
		<-p.Done()
		s.metrics.SandboxProcess(processOutcome(p.Exit()))
	}()
	if !wait {
		writeJSON(w, http.StatusOK, map[string]int{"pid": p.Pid()})
		return
	}
	streamProcess(w, r, p)
}

// queryBool is r's query parameter name as a bool (1, true, 0, false),
// def when it is absent or empty; ok is false for another value.
func queryBool(r *http.Request, name string, def bool) (v, ok bool) {
	switch r.URL.Query().Get(name) {
	case "":
		return def, true
	case "1", "true":
		return true, true
	case "0", "false":
		return false, true
	}
	return false, false
}

// processOutcome is how a process ended, as the outcome label says it.
func processOutcome(e *runapi.ProcessEvent) string {
	switch {
	case e == nil || e.ExitCode == nil:
		return metrics.Error
	case e.TimedOut:
		return metrics.Timeout
	case e.Signal != "":
		return metrics.Signaled
	case *e.ExitCode != 0:
		return metrics.ExitNonzero
	}
	return metrics.OK
}

func (s *Server) processEvents(w http.ResponseWriter, r *http.Request, p runapi.Process) {
	streamProcess(w, r, p)
}

// streamProcess answers with p's events as NDJSON: those kept, then
// those to come, until its exit. Each batch is written before the next
// is asked for, within the write deadline: a client that reads slowly
// misses what the process's bounded tail dropped meanwhile, and holds
// no more than one batch.
func streamProcess(w http.ResponseWriter, r *http.Request, p runapi.Process) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	seq := 0
	for {
		evs, next, done := p.Next(r.Context(), seq)
		seq = next
		var b []byte
		for _, e := range evs {
			line, err := json.Marshal(e)
			if err != nil {
				continue
			}
			b = append(append(b, line...), '\n')
		}
		if len(b) > 0 && writeBounded(w, b) != nil {
			return
		}
		if done || r.Context().Err() != nil {
			return
		}
	}
}

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request, p runapi.Process) {
	var req StdinRequest
	if err := s.readSmall(w, r, maxStdinBody, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	if req.Data != "" && len(req.DataB64) > 0 {
		writeError(w, http.StatusBadRequest, "data_b64", "data and data_b64 are mutually exclusive; give one")
		return
	}
	data := []byte(req.Data)
	if req.DataB64 != "" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(req.DataB64); err != nil {
			writeError(w, http.StatusBadRequest, "data_b64", "data_b64: not base64: "+err.Error())
			return
		}
	}
	if len(data) > MaxStdinBytes {
		writeRefusal(w, refusal(fmt.Errorf("%d bytes of stdin, more than the %d one write takes", len(data), MaxStdinBytes), errkind.TooLarge, "data"))
		return
	}
	if err := p.WriteStdin(data, req.Close); err != nil {
		writeRefusal(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) processSignal(w http.ResponseWriter, r *http.Request, p runapi.Process) {
	var req struct {
		Signal string `json:"signal"`
	}
	if err := s.readSmall(w, r, maxControlBody, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	name := strings.ToUpper(req.Signal)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		writeError(w, http.StatusBadRequest, "signal", fmt.Sprintf("signal %q: want a signal's name, such as SIGINT", req.Signal))
		return
	}
	if err := p.Signal(syscall.Signal(sig)); err != nil {
		writeRefusal(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkTTYSize refuses a terminal's size outside 1..runapi.MaxTTYSize,
// naming the field (prefix and rows or cols).
func checkTTYSize(size TTYSize, prefix string) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"rows", size.Rows}, {"cols", size.Cols}} {
		if f.v < 1 || f.v > runapi.MaxTTYSize {
			return &runapi.Refusal{Why: errkind.Invalid, Field: prefix + f.name,
				Msg: fmt.Sprintf("%s%s: %d; want 1 to %d", prefix, f.name, f.v, runapi.MaxTTYSize)}
		}
	}
	return nil
}

func (s *Server) processResize(w http.ResponseWriter, r *http.Request, p runapi.Process) {
	var req TTYSize
	if err := s.readSmall(w, r, maxControlBody, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	if err := checkTTYSize(req, ""); err != nil {
		writeRefusal(w, err)
		return
	}
	if err := p.Resize(req); err != nil {
		writeRefusal(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) sandboxFile(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox) {
	name := r.PathValue("path")
	switch r.Method {
	case http.MethodPut:
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(fileDeadline))
		w.Header().Set("Connection", "close")
		switch {
		case r.ContentLength < 0:
			writeError(w, http.StatusLengthRequired, "", "a file is sent with its Content-Length")
			return
		case r.ContentLength > session.MaxFileBytes:
			writeRefusal(w, refusal(fmt.Errorf("a file of %d bytes, more than the %d one write takes", r.ContentLength, session.MaxFileBytes), errkind.TooLarge, ""))
			return
		}
		if err := sb.WriteFile(name, r.Body, r.ContentLength); err != nil {
			writeFileError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case http.MethodDelete:
		if err := sb.Remove(name); err != nil {
			writeFileError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		if list, _ := queryBool(r, "list", false); list {
			depth := 1
			if d := r.URL.Query().Get("depth"); d != "" {
				n, err := strconv.Atoi(d)
				if err != nil {
					writeError(w, http.StatusBadRequest, "", fmt.Sprintf("depth %q: not a number", d))
					return
				}
				depth = n
			}
			files, err := sb.ListDepth(name, depth)
			if err != nil {
				writeFileError(w, err)
				return
			}
			if files == nil {
				files = []runapi.FileInfo{}
			}
			writeJSON(w, http.StatusOK, files)
			return
		}
		data, err := sb.ReadFile(name, session.MaxFileBytes)
		if err != nil {
			writeFileError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		_ = writeBounded(w, data)
	}
}

// writeFileError answers a sandbox's file error: none there 404, a path
// or a kind of file the request cannot have 400, no room 413; the rest
// by its kind.
func writeFileError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "", err.Error())
	case errkind.Of(err) != errkind.Unknown:
		writeRefusal(w, err)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR),
		errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY), errors.Is(err, fs.ErrInvalid),
		errors.Is(err, unix.EXDEV), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "", err.Error())
	default:
		writeRefusal(w, err)
	}
}
