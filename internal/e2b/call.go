package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

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
	header, want := AccessTokenHeader, "\x00" // no sandbox: a token given still counts, and fails
	if port != EnvdPort && port != InterpreterPort {
		header = TrafficTokenHeader
	}
	if rec != nil {
		want = rec.envdToken
		if header == TrafficTokenHeader {
			want = rec.trafficToken
		}
	}
	got := r.Header.Get(header)
	check := func() bool { return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 }
	if got == "" && port == EnvdPort && isSignedFiles(r) {
		// The SDK's uploadUrl/downloadUrl: signed with the access token.
		got = r.URL.Query().Get("signature")
		check = func() bool { return rec != nil && signedBy(r, rec.envdToken, time.Now()) }
	}
	if got == "" && port == InterpreterPort {
		// @e2b/code-interpreter sends its contexts' calls with the
		// trafficAccessToken alone (its runCode with both).
		got, want = r.Header.Get(TrafficTokenHeader), "\x00"
		if rec != nil {
			want = rec.trafficToken
		}
	}
	ok := false
	if got != "" {
		var wait time.Duration
		ok, wait = h.check(r, check)
		if wait > 0 {
			writeRetry(w, wait, "too many wrong access tokens from this client: try again later")
			return
		}
	}
	if rec == nil {
		// E2B's proxy answers 502 for a sandbox that is not running:
		// the SDKs turn it into their "not running anymore" errors.
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "sandboxId": id,
			"message": "The sandbox was not found: it ended, or never was"})
		return
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

// isSignedFiles says whether r is a call of /files that carries a
// signature (the SDK's uploadUrl and downloadUrl, which a browser or
// another program fetches without the access token).
func isSignedFiles(r *http.Request) bool {
	return r.URL.Path == "/files" && r.URL.Query().Has("signature")
}

// signedBy says whether r's signature is the one E2B's SDKs make with
// token for r's path, user and operation (read for GET and HEAD, write
// for any other method), and its expiration, if it has one, is after
// now: "v1_" and the unpadded base64 of the SHA-256 of
// "PATH:OPERATION:USER:TOKEN[:EXPIRATION]".
func signedBy(r *http.Request, token string, now time.Time) bool {
	q := r.URL.Query()
	op := "write"
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		op = "read"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || n <= now.Unix() {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) == 1
}
