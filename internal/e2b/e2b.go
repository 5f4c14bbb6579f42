package e2b

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem"
	"github.com/agentrun/agentrun/internal/e2b/envd/process"
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
	// Guess, when set, is serve's throttle of wrong credentials: every
	// key and access token given is checked under it (a wrong one spends
	// a guess of the client's source; with none left, 429 and
	// Retry-After before any compare).
	Guess func(r *http.Request, check func() bool) (ok bool, wait time.Duration)

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
	// envd's generated protocol packages build their descriptors on
	// demand (make e2b-proto), not in every agentrun process's init.
	process.Register()
	filesystem.Register()
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
// the config's, under the throttle of guesses. Every key is compared,
// each in constant time.
func (h *Handler) userOf(r *http.Request) (user string, ok bool, wait time.Duration) {
	got := r.Header.Get(APIKeyHeader)
	if got == "" {
		return "", false, 0
	}
	ok, wait = h.check(r, func() bool {
		for _, k := range *h.keys.Load() {
			if subtle.ConstantTimeCompare([]byte(got), []byte(k.key)) == 1 && user == "" {
				user = k.user
			}
		}
		return user != ""
	})
	return user, ok, wait
}

// check is check() under the throttle of guesses, when there is one.
func (h *Handler) check(r *http.Request, check func() bool) (ok bool, wait time.Duration) {
	if h.Guess == nil {
		return check(), 0
	}
	return h.Guess(r, check)
}

// ServeHTTP routes a call into a sandbox (E2b-Sandbox-Id) or the control
// API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := namedPort(r.Host, h.cfg.Load().E2B.Domain); ok {
		// PORT-ID.DOMAIN (e2b.domain): the SDK's getHost, and envd's
		// own name without E2B_SANDBOX_URL.
		r.Header.Set(SandboxIDHeader, id)
		r.Header.Set(SandboxPortHeader, port)
		h.serveCall(w, r)
		return
	}
	if r.Header.Get(SandboxIDHeader) != "" {
		h.serveCall(w, r)
		return
	}
	user, ok, wait := h.userOf(r)
	if wait > 0 {
		writeRetry(w, wait, "too many wrong keys from this client: try again later")
		return
	}
	if !ok {
		WriteError(w, http.StatusUnauthorized, "Invalid API key: the E2B door takes a key of the config's e2b.keys in X-API-Key")
		return
	}
	h.control.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
}

// namedPort is the sandbox id and port that host names on domain
// (PORT-ID.DOMAIN, any case, any port of the host); ok false when domain
// is "" or host is no such name.
func namedPort(host, domain string) (id, port string, ok bool) {
	if domain == "" {
		return "", "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(name, "."+strings.ToLower(strings.TrimSuffix(domain, ".")))
	if !ok || strings.Contains(label, ".") {
		return "", "", false
	}
	port, id, ok = strings.Cut(label, "-")
	return id, port, ok && id != "" && port != ""
}

type userKey struct{}

// userFrom is the control API call's user (ServeHTTP put it there).
func userFrom(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}
