package e2b

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentrun/agentrun/internal/runapi"
)

// Call is a call into a sandbox, checked: the handlers of the envd and
// code interpreter muxes get it with CallOf.
type Call struct {
	// Sandbox is the live sandbox the call is into.
	Sandbox runapi.Sandbox
	// ID is its id (E2b-Sandbox-Id), User its key's user.
	ID, User string
	// Port is the port the call is for (E2b-Sandbox-Port).
	Port int
	rec  *record
}

// Keep is the value kept under key for the sandbox's life, made by mk
// at the first call: state that lives as long as the sandbox (an
// interpreter's context). A value that is an io.Closer is closed when
// the sandbox ends through the door, or when the door finds it ended;
// mk's value is closed at once, and nil returned, when the sandbox ended
// already. mk runs under the sandbox's lock: it must not block.
func (c *Call) Keep(key any, mk func() any) any {
	c.rec.mu.Lock()
	if c.rec.gone {
		c.rec.mu.Unlock()
		return nil
	}
	v, ok := c.rec.kept[key]
	if !ok {
		v = mk()
		if c.rec.kept == nil {
			c.rec.kept = map[any]any{}
		}
		c.rec.kept[key] = v
	}
	c.rec.mu.Unlock()
	return v
}

type callKey struct{}

// CallOf is the call ctx's request is (set by the door before a handler
// of a call into a sandbox runs), nil outside one.
func CallOf(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}

// serveCall checks a call into a sandbox and hands it to its port's
// handler.
func (h *Handler) serveCall(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(SandboxIDHeader)
	port, err := strconv.Atoi(r.Header.Get(SandboxPortHeader))
	if err != nil || port < 1 || port > 65535 {
		WriteError(w, http.StatusBadRequest, "E2b-Sandbox-Port is not a TCP port (1 to 65535)")
		return
	}
	rec, sb := h.lookup(id)
	if rec == nil {
		// E2B's proxy answers 502 for a sandbox that is not running:
		// the SDKs turn it into their "not running anymore" errors.
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "sandboxId": id,
			"message": "The sandbox was not found: it ended, or never was"})
		return
	}
	header, want := AccessTokenHeader, rec.envdToken
	if port != EnvdPort && port != InterpreterPort {
		header, want = TrafficTokenHeader, rec.trafficToken
	}
	ok := subtle.ConstantTimeCompare([]byte(r.Header.Get(header)), []byte(want)) == 1
	if port == InterpreterPort && r.Header.Get(header) == "" {
		// @e2b/code-interpreter sends its contexts' calls with the
		// trafficAccessToken alone (its runCode with both).
		ok = subtle.ConstantTimeCompare([]byte(r.Header.Get(TrafficTokenHeader)), []byte(rec.trafficToken)) == 1
	}
	if !ok {
		msg := "a call into the sandbox needs its access token in " + header + " (given at create and connect)"
		if port == EnvdPort && isConnectUnary(r) {
			// Connect's own error body, which the SDK's client reads.
			writeJSON(w, http.StatusUnauthorized, map[string]string{"code": "unauthenticated", "message": msg})
			return
		}
		WriteError(w, http.StatusUnauthorized, msg)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), callKey{}, &Call{Sandbox: sb, ID: id, User: rec.user, Port: port, rec: rec}))
	switch port {
	case EnvdPort:
		h.envd.ServeHTTP(w, r)
	case InterpreterPort:
		h.interp.ServeHTTP(w, r)
	default:
		proxyPort(w, r, sb, port)
	}
}

// isConnectUnary says whether r is a unary call of the Connect protocol
// (a service's method, a JSON or protobuf body).
func isConnectUnary(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return r.Method == http.MethodPost && (ct == "application/json" || ct == "application/proto") &&
		strings.Count(r.URL.Path, "/") == 2 && strings.Contains(r.URL.Path, ".")
}
