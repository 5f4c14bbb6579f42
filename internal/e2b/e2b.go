package e2b

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/secret"
)

// The ports E2B's SDKs address inside a sandbox (E2b-Sandbox-Port).
const (
	EnvdPort        = 49983
	InterpreterPort = 49999
)

// The headers of a call into a sandbox.
const (
	SandboxIDHeader    = "E2b-Sandbox-Id"
	SandboxPortHeader  = "E2b-Sandbox-Port"
	AccessTokenHeader  = "X-Access-Token"
	TrafficTokenHeader = "E2b-Traffic-Access-Token"
	APIKeyHeader       = "X-Api-Key"
)

// Handler is the E2B door: an http.Handler for serve's /e2b (with the
// prefix stripped), and what serve's Door asks of a door.
type Handler struct {
	sandboxes runapi.Sandboxes
	logf      func(string, ...any)
	cfg       atomic.Pointer[config.Config]
	keys      atomic.Pointer[[]apiKey]

	mu      sync.Mutex
	records map[string]*record // by sandbox id

	control, envd, interp *http.ServeMux
}

// apiKey is one key of e2b.keys, read from its file.
type apiKey struct {
	user, key string
}

// New is the door for cfg's e2b section over sandboxes. It fails when a
// key's file cannot be read or is not root's alone.
func New(cfg *config.Config, sandboxes runapi.Sandboxes, logf func(string, ...any)) (*Handler, error) {
	h := &Handler{sandboxes: sandboxes, logf: logf, records: map[string]*record{},
		control: http.NewServeMux(), envd: http.NewServeMux(), interp: http.NewServeMux()}
	keys, err := readKeys(cfg)
	if err != nil {
		return nil, err
	}
	h.keys.Store(&keys)
	h.cfg.Store(cfg)
	h.routeControl(h.control)
	h.routeEnvd(h.envd)
	h.routeFilesystem(h.envd)
	h.routeInterpreter(h.interp)
	return h, nil
}

// readKeys reads cfg's e2b.keys from their files.
func readKeys(cfg *config.Config) ([]apiKey, error) {
	var keys []apiKey
	for _, user := range cfg.E2B.KeyNames() {
		k, err := secret.Read(cfg.E2B.Keys[user].File)
		if err != nil {
			return nil, fmt.Errorf("e2b.keys.%s: %w", user, err)
		}
		keys = append(keys, apiKey{user: user, key: k})
	}
	return keys, nil
}

// HTTPHandler is h.
func (h *Handler) HTTPHandler() http.Handler { return h }

// Reload makes cfg's templates and keys those of the calls that come
// next; a key whose file fails keeps the keys before (logged).
func (h *Handler) Reload(cfg *config.Config) {
	keys, err := readKeys(cfg)
	if err != nil {
		h.logf("e2b: the keys before stay: %v", err)
	} else {
		h.keys.Store(&keys)
	}
	h.cfg.Store(cfg)
}

// Shutdown has nothing to wait for: the sandboxes' streams end with
// them, as serve ends them first.
func (h *Handler) Shutdown(context.Context) {}

// Close lets go of what the door keeps of each sandbox (closing what
// its handlers kept); serve ends the sandboxes themselves.
func (h *Handler) Close() {
	h.mu.Lock()
	recs := h.records
	h.records = map[string]*record{}
	h.mu.Unlock()
	for _, rec := range recs {
		rec.release()
	}
}

// userOf is the user of the key r carries, ok false if none is one of
// the config's. Every key is compared, each in constant time.
func (h *Handler) userOf(r *http.Request) (user string, ok bool) {
	got := r.Header.Get(APIKeyHeader)
	if got == "" {
		return "", false
	}
	for _, k := range *h.keys.Load() {
		if subtle.ConstantTimeCompare([]byte(got), []byte(k.key)) == 1 && !ok {
			user, ok = k.user, true
		}
	}
	return user, ok
}

// ServeHTTP routes a call into a sandbox (E2b-Sandbox-Id) or the control
// API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(SandboxIDHeader) != "" {
		h.serveCall(w, r)
		return
	}
	user, ok := h.userOf(r)
	if !ok {
		WriteError(w, http.StatusUnauthorized, "Invalid API key: the E2B door takes a key of the config's e2b.keys in X-API-Key")
		return
	}
	h.control.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
}

type userKey struct{}

// userFrom is the control API call's user (ServeHTTP put it there).
func userFrom(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}
