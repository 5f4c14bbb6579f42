package interp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/jsonkeys"
)

// MaxBody bounds a request's body: a cell's code and its env.
const MaxBody = 4 << 20

// Port is the sandbox port E2B's code interpreter answers on.
const Port = 49999

// ServeHTTP answers the code interpreter's API as @e2b/code-interpreter
// calls it, at r.URL.Path relative to the sandbox's port (the caller
// strips its own base): POST /execute (a stream of JSON lines), POST and
// GET /contexts, DELETE /contexts/ID, POST /contexts/ID/restart, GET
// /health. The caller has checked the request's credentials for the
// sandbox.
func (in *Interpreter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/health" && r.Method == http.MethodGet:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `"OK"`)
	case p == "/execute" && r.Method == http.MethodPost:
		in.execute(w, r)
	case p == "/contexts" && r.Method == http.MethodPost:
		var req struct {
			Language string `json:"language"`
			Cwd      string `json:"cwd"`
		}
		if !readBody(w, r, &req) {
			return
		}
		c, err := in.Create(r.Context(), req.Language, req.Cwd)
		if err != nil {
			fail(w, err)
			return
		}
		writeJSON(w, c)
	case p == "/contexts" && r.Method == http.MethodGet:
		writeJSON(w, in.List())
	case strings.HasPrefix(p, "/contexts/"):
		rest := strings.TrimPrefix(p, "/contexts/")
		if id, ok := strings.CutSuffix(rest, "/restart"); ok && r.Method == http.MethodPost && !strings.Contains(id, "/") {
			if err := in.Restart(r.Context(), id); err != nil {
				fail(w, err)
				return
			}
			writeJSON(w, nil)
			return
		}
		if r.Method == http.MethodDelete && !strings.Contains(rest, "/") {
			if err := in.Remove(rest); err != nil {
				fail(w, err)
				return
			}
			writeJSON(w, nil)
			return
		}
		http.Error(w, "Not Found", http.StatusNotFound)
	default:
		http.Error(w, "Not Found", http.StatusNotFound)
	}
}

// execute answers POST /execute: the cell's messages as JSON lines, as
// they come, ended by end_of_execution.
func (in *Interpreter) execute(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Code      *string           `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if !readBody(w, r, &req) {
		return
	}
	if req.Code == nil {
		http.Error(w, "code: missing", http.StatusBadRequest)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		http.Error(w, "Only one of context_id or language can be provided", http.StatusBadRequest)
		return
	}
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			http.Error(w, "env_vars: not a variable name and value", http.StatusBadRequest)
			return
		}
	}
	var c *Context
	var err error
	if req.ContextID != "" {
		c, err = in.Get(req.ContextID)
	} else {
		c, err = in.Default(r.Context(), req.Language)
	}
	if err != nil {
		fail(w, err)
		return
	}
	rc := http.NewResponseController(w)
	started := false
	emit := func(v any) error {
		line, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := c.Execute(r.Context(), Request{Code: *req.Code, Env: req.EnvVars}, emit); err != nil {
		if !started && errors.Is(err, errNotFound) && req.ContextID != "" {
			fail(w, err)
			return
		}
		// An interpreter that cannot start (an image without python3)
		// is the cell's error, which the SDK shows.
		_ = emit(map[string]any{"type": "error", "name": "InterpreterError", "value": err.Error(), "traceback": ""})
	}
	_ = emit(map[string]any{"type": "end_of_execution"})
}

// readBody decodes r's JSON body into v: at most MaxBody, no key twice;
// an empty body leaves v as it is. It answers 400 itself and returns
// false on a body that is not.
func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		http.Error(w, fmt.Sprintf("reading the body: %v", err), http.StatusBadRequest)
		return false
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return true
	}
	if err := jsonkeys.Check(data); err != nil {
		http.Error(w, fmt.Sprintf("the body: %v", err), http.StatusBadRequest)
		return false
	}
	if err := json.Unmarshal(data, v); err != nil {
		http.Error(w, fmt.Sprintf("the body: %v", err), http.StatusBadRequest)
		return false
	}
	return true
}

func jsonCheck(s string) error { return jsonkeys.Check([]byte(s)) }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// fail answers err with the status E2B's SDK reads: 404 (its body shown
// as a NotFoundError's message) for a context or an interpreter that is
// not there, 400 for a bad request, 429 past a bound, 500 otherwise.
func fail(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch errkind.Or(err, errkind.Unknown) {
	case errkind.NotFound:
		status = http.StatusNotFound
	case errkind.Invalid:
		status = http.StatusBadRequest
	case errkind.Quota:
		status = http.StatusTooManyRequests
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		status = http.StatusRequestEntityTooLarge
	}
	http.Error(w, err.Error(), status)
}
