package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// SessionInfo is the answer of GET /v1/sessions/ID: the session and its
// files (name, type, size, mtime), cut at session.MaxList entries.
type SessionInfo struct {
	session.Info
	session.Listing
}

// routeSessions adds the session endpoints to mux.
func (s *Server) routeSessions(mux *http.ServeMux) {
	mux.HandleFunc("/v1/sessions", only(s.postSession, http.MethodPost))
	mux.HandleFunc("/v1/sessions/{id}", only(s.session, http.MethodGet, http.MethodDelete))
	mux.HandleFunc("/v1/sessions/{id}/files/{path...}", only(s.sessionFile, http.MethodGet, http.MethodPut))
	mux.HandleFunc("/v1/sessions/{id}/fork", only(s.forkSession, http.MethodPost))
}

// ForkRequest is the body of POST /v1/sessions/ID/fork.
type ForkRequest struct {
	Count *int `json:"count"`
}

// ForkAnswer is the answer of a fork: the new sessions, in order, and
// how their files were copied ("reflink": blocks shared with the source;
// "copy": the data copied).
type ForkAnswer struct {
	Sessions []ForkedSession `json:"sessions"`
	Copy     string          `json:"copy"`
}

// ForkedSession is one session a fork made.
type ForkedSession struct {
	ID string `json:"id"`
}

// maxForkBody bounds the body of a fork request.
const maxForkBody = 1024

func (s *Server) forkSession(w http.ResponseWriter, r *http.Request) {
	if s.Sessions == nil {
		writeError(w, http.StatusNotFound, "", "sessions are not available on this server")
		return
	}
	var req ForkRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxForkBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Count == nil {
		writeError(w, http.StatusBadRequest, "count", fmt.Sprintf(`want {"count": N}, N from 1 to %d`, session.MaxFork))
		return
	}
	f, err := s.Sessions.Fork(r.Context(), r.PathValue("id"), *req.Count)
	if err != nil {
		if errors.Is(err, session.ErrBadCount) {
			writeError(w, http.StatusBadRequest, "count", err.Error())
			return
		}
		writeSessionError(w, err)
		return
	}
	a := ForkAnswer{Sessions: make([]ForkedSession, len(f.IDs)), Copy: string(f.Mode)}
	for i, id := range f.IDs {
		a.Sessions[i] = ForkedSession{ID: id}
	}
	writeJSON(w, http.StatusCreated, a)
}

func (s *Server) postSession(w http.ResponseWriter, r *http.Request) {
	if s.Sessions == nil {
		writeError(w, http.StatusNotFound, "", "sessions are not available on this server")
		return
	}
	id, err := s.Sessions.Create()
	if err != nil {
		writeSessionError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": id})
}

func (s *Server) session(w http.ResponseWriter, r *http.Request) {
	if s.Sessions == nil {
		writeError(w, http.StatusNotFound, "", "sessions are not available on this server")
		return
	}
	id := r.PathValue("id")
	if r.Method == http.MethodDelete {
		if err := s.Sessions.Remove(id); err != nil {
			writeSessionError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	in, err := s.Sessions.Get(id)
	if err != nil {
		writeSessionError(w, err)
		return
	}
	l, err := s.Sessions.Files(id)
	if err != nil {
		writeSessionError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, SessionInfo{Info: *in, Listing: *l})
}

// fileDeadline bounds the sending of an uploaded file.
var fileDeadline = 30 * time.Second

func (s *Server) sessionFile(w http.ResponseWriter, r *http.Request) {
	if s.Sessions == nil {
		writeError(w, http.StatusNotFound, "", "sessions are not available on this server")
		return
	}
	id, name := r.PathValue("id"), r.PathValue("path")
	if r.Method == http.MethodPut {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(fileDeadline))
		w.Header().Set("Connection", "close")
		body := http.MaxBytesReader(w, r.Body, session.MaxFileBytes)
		if err := s.Sessions.WriteFile(id, name, body); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				err = fmt.Errorf("%w: more than %d bytes", session.ErrTooLarge, session.MaxFileBytes)
			}
			writeSessionError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	data, err := s.Sessions.ReadFile(id, name)
	if err != nil {
		writeSessionError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	w.Write(data)
}

// writeSessionError answers a session error with its status.
func writeSessionError(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), "", err.Error())
}

// checkSession refuses at once, before any answer starts (a stream's
// included; RunTask's too), a run whose kept session is unknown (404) or in use by
// another run (409). The runner's lock still decides a race between two
// runs that both pass this check.
func (s *Server) checkSession(plan *task.Plan) error {
	if !plan.KeepWorkspace || s.Sessions == nil {
		return nil
	}
	in, err := s.Sessions.Get(plan.Session)
	if err != nil {
		return fmt.Errorf("%w: %s", err, plan.Session)
	}
	if in.Busy {
		return fmt.Errorf("%w: %s", session.ErrBusy, plan.Session)
	}
	return nil
}
