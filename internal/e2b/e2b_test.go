package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/test/testenv"
)

// fakeSandboxes keeps each user's sandboxes apart, as the sandbox
// package's door does.
type fakeSandboxes struct {
	mu   sync.Mutex
	n    int
	byID map[string]*fakeSandbox
}

type fakeSandbox struct {
	runapi.Sandbox // the methods a test does not reach
	id, user       string
	closed         bool
	dialed         int
	expires        time.Time
}

func (f *fakeSandboxes) Create(_ context.Context, plan *task.Plan, user string, life, _ time.Duration) (runapi.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	sb := &fakeSandbox{id: "sb-" + strings.Repeat("0", 31) + string(rune('0'+f.n)), user: user, expires: time.Now().Add(life)}
	if f.byID == nil {
		f.byID = map[string]*fakeSandbox{}
	}
	f.byID[sb.id] = sb
	return sb, nil
}

func (f *fakeSandboxes) Get(user, id string) runapi.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.byID[id]; sb != nil && sb.user == user && !sb.closed {
		return sb
	}
	return nil
}

func (f *fakeSandboxes) List(string) []runapi.Sandbox { return nil }

// ReadFile finds no file: a call that reached it passed the door's checks.
func (s *fakeSandbox) ReadFile(name string, _ int64) ([]byte, error) {
	return nil, errkind.Mark(errkind.NotFound, fmt.Errorf("%s: %w", name, fs.ErrNotExist))
}
func (f *fakeSandboxes) SetBounds(config.Sandboxes) {}
func (f *fakeSandboxes) Live() int                  { return 0 }
func (f *fakeSandboxes) CloseAll() error            { return nil }

func (sb *fakeSandbox) Info() runapi.SandboxInfo {
	return runapi.SandboxInfo{ID: sb.id, ExpiresAt: sb.expires, Created: time.Now()}
}
func (sb *fakeSandbox) Close() error { sb.closed = true; return nil }
func (sb *fakeSandbox) DialPort(context.Context, int) (net.Conn, error) {
	sb.dialed++
	return nil, errkind.New(errkind.Upstream, "nothing listens")
}

// keyFile writes key into a root-only file of dir and returns its path.
func keyFile(t *testing.T, dir, name, key string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(key+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// door is a door over fake sandboxes with keys of alice and bob.
func door(t *testing.T) (*Handler, *fakeSandboxes, *httptest.Server, *config.Config) {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cfg := config.Default()
	cfg.E2B.Templates = map[string]string{"base": "registry.example/base:1"}
	cfg.E2B.Keys = map[string]config.E2BKey{
		"alice": {File: keyFile(t, dir, "alice", "e2b_alice", 0o600)},
		"bob":   {File: keyFile(t, dir, "bob", "e2b_bob", 0o400)},
	}
	f := &fakeSandboxes{}
	h, err := New(cfg, f, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return h, f, ts, cfg
}

// call sends method path with body and headers, returning the status
// and the body.
func call(t *testing.T, ts *httptest.Server, method, path, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestControlAuth: the control API answers a missing or wrong key 401
// in E2B's shape; a key creates its user's sandbox with both tokens;
// another key neither gets, lists, times nor kills it (404), the owner
// does.
func TestControlAuth(t *testing.T) {
	_, f, ts, _ := door(t)
	for _, hdr := range []map[string]string{nil, {"X-API-Key": "e2b_wrong"}, {"X-API-Key": "e2b_alic"}, {"X-API-Key": "e2b_alicex"}} {
		if st, body := call(t, ts, "POST", "/sandboxes", `{"templateID": "base"}`, hdr); st != 401 || !strings.Contains(body, `"code":401`) {
			t.Errorf("key %v: %d %s, want 401", hdr, st, body)
		}
	}
	alice, bob := map[string]string{"X-API-Key": "e2b_alice"}, map[string]string{"X-API-Key": "e2b_bob"}
	st, body := call(t, ts, "POST", "/v2/sandboxes", `{"templateID": "base", "timeout": 60, "metadata": {"k": "v"}}`, alice)
	var sb sandboxJSON
	if err := json.Unmarshal([]byte(body), &sb); st != 201 || err != nil || sb.EnvdAccessToken == "" || sb.TrafficAccessToken == "" ||
		sb.EnvdAccessToken == sb.TrafficAccessToken || sb.EnvdVersion != EnvdVersion {
		t.Fatalf("create: %d %s", st, body)
	}
	if f.byID[sb.SandboxID].user != "alice" {
		t.Errorf("created for %q, want alice", f.byID[sb.SandboxID].user)
	}
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + sb.SandboxID, ""},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout": 5}`},
		{"POST", "/v2/sandboxes/" + sb.SandboxID + "/connect", `{}`},
		{"DELETE", "/sandboxes/" + sb.SandboxID, ""},
	} {
		if st, body := call(t, ts, r.method, r.path, r.body, bob); st != 404 || strings.Contains(body, sb.EnvdAccessToken) {
			t.Errorf("bob's %s %s: %d %s, want 404", r.method, r.path, st, body)
		}
	}
	if st, body := call(t, ts, "GET", "/v2/sandboxes", "", bob); st != 200 || body != "[]\n" {
		t.Errorf("bob's list: %d %s", st, body)
	}
	if f.byID[sb.SandboxID].closed {
		t.Fatal("bob's DELETE ended alice's sandbox")
	}
	if st, body := call(t, ts, "GET", "/v2/sandboxes?metadata=k%3Dv", "", alice); st != 200 || !strings.Contains(body, sb.SandboxID) {
		t.Errorf("alice's list: %d %s", st, body)
	}
	if st, _ := call(t, ts, "DELETE", "/sandboxes/"+sb.SandboxID, "", alice); st != 204 || !f.byID[sb.SandboxID].closed {
		t.Errorf("alice's DELETE: %d", st)
	}
	if st, _ := call(t, ts, "GET", "/sandboxes/"+sb.SandboxID, "", alice); st != 404 {
		t.Errorf("GET after DELETE: %d, want 404", st)
	}
}

// TestCallRouting: a call into a sandbox needs its envd access token
// (envd's and the interpreter's ports, where a call without it may carry
// the traffic token instead) or its traffic token (any other),
// each the sandbox's own; it reaches envd's /health, the interpreter's
// mux, or the sandbox's port; a sandbox that is none is 502 as E2B's
// proxy answers, and a bad port 400.
func TestCallRouting(t *testing.T) {
	_, f, ts, _ := door(t)
	alice := map[string]string{"X-API-Key": "e2b_alice"}
	made := func() sandboxJSON {
		_, body := call(t, ts, "POST", "/sandboxes", `{}`, alice)
		var sb sandboxJSON
		if err := json.Unmarshal([]byte(body), &sb); err != nil || sb.SandboxID == "" {
			t.Fatalf("create: %s", body)
		}
		return sb
	}
	a, b := made(), made()
	into := func(sb sandboxJSON, port, tokenHeader, token string) map[string]string {
		return map[string]string{SandboxIDHeader: sb.SandboxID, SandboxPortHeader: port, tokenHeader: token}
	}
	for _, c := range []struct {
		name string
		hdr  map[string]string
		path string
		want int
	}{
		{"envd with its token", into(a, "49983", AccessTokenHeader, a.EnvdAccessToken), "/health", 204},
		{"envd with no token", into(a, "49983", "X-Other", a.EnvdAccessToken), "/health", 401},
		{"envd with another sandbox's token", into(a, "49983", AccessTokenHeader, b.EnvdAccessToken), "/health", 401},
		{"envd with the traffic token", into(a, "49983", AccessTokenHeader, a.TrafficAccessToken), "/health", 401},
		{"envd with the API key alone", map[string]string{SandboxIDHeader: a.SandboxID, SandboxPortHeader: "49983", "X-API-Key": "e2b_alice"}, "/health", 401},
		{"the interpreter", into(a, "49999", AccessTokenHeader, a.EnvdAccessToken), "/contexts", 200},
		{"the interpreter, the traffic token alone (as @e2b/code-interpreter's context calls)", into(a, "49999", TrafficTokenHeader, a.TrafficAccessToken), "/contexts", 200},
		{"the interpreter, another sandbox's traffic token", into(a, "49999", TrafficTokenHeader, b.TrafficAccessToken), "/contexts", 401},
		{"the interpreter, the traffic token in the access token's header", into(a, "49999", AccessTokenHeader, a.TrafficAccessToken), "/contexts", 401},
		{"the interpreter, no token", into(a, "49999", "X-Other", a.EnvdAccessToken), "/contexts", 401},
		{"a port with the envd token", into(a, "8080", AccessTokenHeader, a.EnvdAccessToken), "/", 401},
		{"a port with the traffic token", into(a, "8080", TrafficTokenHeader, a.TrafficAccessToken), "/", 502},
		{"a bad port", into(a, "0", AccessTokenHeader, a.EnvdAccessToken), "/health", 400},
		{"no such sandbox", map[string]string{SandboxIDHeader: "sb-none", SandboxPortHeader: "49983", AccessTokenHeader: a.EnvdAccessToken}, "/health", 502},
	} {
		if st, body := call(t, ts, "GET", c.path, "", c.hdr); st != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, st, body, c.want)
		}
	}
	if d := f.byID[a.SandboxID].dialed; d != 1 {
		t.Errorf("the sandbox's port was dialled %d times, want once (with the traffic token only)", d)
	}
	// Ended (as by expiry): its calls are 502, its record let go.
	f.byID[a.SandboxID].closed = true
	if st, _ := call(t, ts, "GET", "/health", "", into(a, "49983", AccessTokenHeader, a.EnvdAccessToken)); st != 502 {
		t.Errorf("a call into an ended sandbox: %d, want 502", st)
	}
}

// TestKeys: a key file that is not root's alone stops the door; a
// reload reads the files again, and one that fails keeps the keys
// before.
func TestKeys(t *testing.T) {
	h, _, ts, cfg := door(t)
	dir := t.TempDir()
	bad := *cfg
	bad.E2B.Keys = map[string]config.E2BKey{"eve": {File: keyFile(t, dir, "eve", "e2b_eve", 0o640)}}
	if _, err := New(&bad, &fakeSandboxes{}, t.Logf); err == nil || !strings.Contains(err.Error(), "e2b.keys.eve") {
		t.Errorf("a group-readable key file: %v", err)
	}
	h.Reload(&bad)
	if st, _ := call(t, ts, "GET", "/v2/sandboxes", "", map[string]string{"X-API-Key": "e2b_alice"}); st != 200 {
		t.Errorf("after a reload whose key fails, alice's key: %d, want 200 (the keys before)", st)
	}
	next := *cfg
	next.E2B.Keys = map[string]config.E2BKey{"carol": {File: keyFile(t, dir, "carol", "e2b_carol", 0o600)}}
	h.Reload(&next)
	if st, _ := call(t, ts, "GET", "/v2/sandboxes", "", map[string]string{"X-API-Key": "e2b_alice"}); st != 401 {
		t.Errorf("after a reload without alice, her key: %d, want 401", st)
	}
	if st, _ := call(t, ts, "GET", "/v2/sandboxes", "", map[string]string{"X-API-Key": "e2b_carol"}); st != 200 {
		t.Errorf("after a reload, carol's key: %d, want 200", st)
	}
}

// TestGuessesThrottled: every key and access token given is checked
// under serve's throttle of wrong credentials: with the client's guesses
// spent, a key or a token is answered 429 with Retry-After, uncompared;
// a call with no credential spends none.
func TestGuessesThrottled(t *testing.T) {
	h, _, ts, _ := door(t)
	_, body := call(t, ts, "POST", "/sandboxes", `{}`, map[string]string{"X-API-Key": "e2b_alice"})
	var sb sandboxJSON
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	guesses, spent := 0, false
	h.Guess = func(r *http.Request, check func() bool) (bool, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		guesses++
		if spent {
			return false, 3 * time.Second
		}
		return check(), 0
	}
	if st, _ := call(t, ts, "GET", "/v2/sandboxes", "", nil); st != 401 || guesses != 0 {
		t.Errorf("no key: %d after %d guesses, want 401 and none", st, guesses)
	}
	if st, _ := call(t, ts, "GET", "/v2/sandboxes", "", map[string]string{"X-API-Key": "e2b_wrong"}); st != 401 || guesses != 1 {
		t.Errorf("a wrong key: %d after %d guesses, want 401 and one", st, guesses)
	}
	envd := map[string]string{SandboxIDHeader: sb.SandboxID, SandboxPortHeader: "49983", AccessTokenHeader: "wrong"}
	if st, _ := call(t, ts, "GET", "/health", "", envd); st != 401 || guesses != 2 {
		t.Errorf("a wrong access token: %d after %d guesses, want 401 and two", st, guesses)
	}
	spent = true
	req, _ := http.NewRequest("GET", ts.URL+"/v2/sandboxes", nil)
	req.Header.Set("X-API-Key", "e2b_alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("the right key with no guess left: %d, Retry-After %q; want 429, 3", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	envd[AccessTokenHeader] = sb.EnvdAccessToken
	if st, _ := call(t, ts, "GET", "/health", "", envd); st != 429 {
		t.Errorf("the right access token with no guess left: %d, want 429", st)
	}
}

// TestSignedFiles: /files takes, instead of the access token, the
// signature E2B's SDKs put in uploadUrl and downloadUrl (vectors made as
// the SDK's getSignature makes them): for its path, user and operation
// (read for GET, write otherwise), not past its expiration; anything
// else signed, or a wrong signature, is 401.
func TestSignedFiles(t *testing.T) {
	get := func(q string) *http.Request { return httptest.NewRequest("GET", "/files?"+q, nil) }
	post := func(q string) *http.Request { return httptest.NewRequest("POST", "/files?"+q, nil) }
	now := time.Unix(4102444000, 0)
	for _, c := range []struct {
		r    *http.Request
		want bool
	}{
		{get("path=/home/user/a.txt&username=user&signature=v1_p0WqJQYCLtO6YX%2Be4h7VbpybRsdJbMbIw7clYpulIJk"), true},
		{post("path=/home/user/a.txt&username=user&signature=v1_p0WqJQYCLtO6YX%2Be4h7VbpybRsdJbMbIw7clYpulIJk"), false}, // a read's, for a write
		{get("path=/home/user/b.txt&username=user&signature=v1_p0WqJQYCLtO6YX%2Be4h7VbpybRsdJbMbIw7clYpulIJk"), false},
		{get("path=/home/user/a.txt&username=root&signature=v1_p0WqJQYCLtO6YX%2Be4h7VbpybRsdJbMbIw7clYpulIJk"), false},
		{post("path=/home/user/a.txt&signature=v1_Bmg/l36pAnoXXl94JBx8ZCMUmng5s%2BvDCjyELPiPl0Q&signature_expiration=4102444800"), true},
		{post("path=/home/user/a.txt&signature=v1_Bmg/l36pAnoXXl94JBx8ZCMUmng5s%2BvDCjyELPiPl0Q"), false},
		{post("path=/home/user/a.txt&signature=v1_Bmg/l36pAnoXXl94JBx8ZCMUmng5s%2BvDCjyELPiPl0Q&signature_expiration=4102444801"), false},
	} {
		if got := signedBy(c.r, "tok", now); got != c.want {
			t.Errorf("%s %s: signed %v, want %v", c.r.Method, c.r.URL, got, c.want)
		}
	}
	if signedBy(post("path=/home/user/a.txt&signature=v1_Bmg/l36pAnoXXl94JBx8ZCMUmng5s%2BvDCjyELPiPl0Q&signature_expiration=4102444800"), "tok", time.Unix(4102444800, 0)) {
		t.Error("a signature past its expiration was taken")
	}

	// Through the door: a signature of the sandbox's token passes its
	// check (to the envd mux, which has no /files here: 404), a wrong
	// one does not, and a signature reaches no other path.
	_, _, ts, _ := door(t)
	_, body := call(t, ts, "POST", "/sandboxes", `{}`, map[string]string{"X-API-Key": "e2b_alice"})
	var sb sandboxJSON
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("/x:read::" + sb.EnvdAccessToken))
	sig := url.QueryEscape("v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	into := map[string]string{SandboxIDHeader: sb.SandboxID, SandboxPortHeader: "49983"}
	if st, _ := call(t, ts, "GET", "/files?path=/x&signature="+sig, "", into); st == 401 || st == 429 {
		t.Errorf("a signed download: %d, want past the check (the fake sandbox has no file)", st)
	}
	if st, _ := call(t, ts, "GET", "/files?path=/y&signature="+sig, "", into); st != 401 {
		t.Errorf("a signature for another path: %d, want 401", st)
	}
	if st, _ := call(t, ts, "GET", "/health?path=/x&signature="+sig, "", into); st != 401 {
		t.Errorf("a signature on another endpoint: %d, want 401", st)
	}
}
