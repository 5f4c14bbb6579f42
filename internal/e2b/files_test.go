package e2b

import (
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem"
)

// TestSignedFileCall: a file URL's signature is checked as E2B's SDK
// makes it (the vectors: node's SHA-256 over the SDK's string), for its
// path, operation, user and expiry alone.
func TestSignedFileCall(t *testing.T) {
	const tok = "tok123"
	read := "v1_4uLwK0YL2IHkw+kFQnGplC+W6/Z9e1sJ/GsjvxcxcX8"  // /workspace/a.txt:read::tok123
	write := "v1_Qh8fcPUQ1ZDIZfsULbo3HzKMQCBHEGclm0Io+l7CH4w" // …:write:user:tok123:4102444800
	q := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return "/files?" + v.Encode()
	}
	for _, c := range []struct {
		method, target, token string
		ok                    bool
	}{
		{"GET", q("path", "/workspace/a.txt", "signature", read), tok, true},
		{"GET", q("path", "/workspace/b.txt", "signature", read), tok, false},     // another path
		{"POST", q("path", "/workspace/a.txt", "signature", read), tok, false},    // another operation
		{"GET", q("path", "/workspace/a.txt", "signature", read), "other", false}, // another sandbox's
		{"GET", q("path", "/workspace/a.txt", "username", "root", "signature", read), tok, false},
		{"GET", q("path", "/workspace/a.txt"), tok, false},                   // none
		{"GET", q("path", "/workspace/a.txt", "signature", read), "", false}, // no token
		{"POST", q("path", "/workspace/a.txt", "username", "user", "signature", write, "signature_expiration", "4102444800"), tok, true},
		{"POST", q("path", "/workspace/a.txt", "username", "user", "signature", write), tok, false}, // expiry cut
		{"POST", q("path", "/workspace/a.txt", "username", "user", "signature", write, "signature_expiration", "4102444801"), tok, false},
		{"DELETE", q("path", "/workspace/a.txt", "signature", read), tok, false},
	} {
		r := httptest.NewRequest(c.method, c.target, nil)
		if got := signedFileCall(r, c.token); got != c.ok {
			t.Errorf("%s %s (token %q): %v, want %v", c.method, c.target, c.token, got, c.ok)
		}
	}
	// An expiry past is refused, whatever the signature.
	past := url.Values{"path": {"/x"}, "signature": {write}, "signature_expiration": {"1"}}
	if signedFileCall(httptest.NewRequest("POST", "/files?"+past.Encode(), nil), tok) {
		t.Errorf("an expired signature was taken")
	}
}

// TestWatcherDiff: a watcher's poll says what changed as E2B's events,
// and keeps at most MaxWatchEvents, the oldest going first.
func TestWatcherDiff(t *testing.T) {
	w := &watcher{notify: make(chan struct{}, 1)}
	t0 := time.Unix(100, 0)
	last := map[string]entryState{
		"a":     {typ: "file", mode: "0644", size: 1, mtime: t0},
		"b":     {typ: "file", mode: "0644", size: 1, mtime: t0},
		"c":     {typ: "file", mode: "0644", size: 1, mtime: t0},
		"d":     {typ: "dir", mode: "0755", mtime: t0},
		"d/old": {typ: "file", mode: "0644", mtime: t0},
	}
	now := map[string]entryState{
		"a":     {typ: "file", mode: "0644", size: 2, mtime: t0},                  // written
		"b":     {typ: "file", mode: "0600", size: 1, mtime: t0},                  // chmod
		"c":     {typ: "file", mode: "0644", size: 1, mtime: t0.Add(time.Second)}, // written, same size
		"d":     {typ: "dir", mode: "0755", mtime: t0},
		"d/new": {typ: "file", mode: "0644", mtime: t0}, // created; d/old removed
	}
	w.diff(last, now)
	evs, err := w.take()
	var got []string
	for _, e := range evs {
		got = append(got, e.Type.String()+":"+e.Name)
	}
	want := []string{"EVENT_TYPE_REMOVE:d/old", "EVENT_TYPE_WRITE:a", "EVENT_TYPE_CHMOD:b", "EVENT_TYPE_WRITE:c", "EVENT_TYPE_CREATE:d/new"}
	if err != nil || len(got) != len(want) {
		t.Fatalf("events %q, %v; want %q", got, err, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: %s, want %s", i, got[i], want[i])
		}
	}
	// Past the bound, the oldest go.
	for i := range MaxWatchEvents + 10 {
		w.diff(map[string]entryState{}, map[string]entryState{string(rune('a'+i%26)) + "x": {typ: "file"}})
	}
	evs, _ = w.take()
	if len(evs) != MaxWatchEvents || w.dropped != 10 || evs[0].Type != filesystem.EventType_EVENT_TYPE_CREATE {
		t.Errorf("past the bound: %d events kept, %d dropped", len(evs), w.dropped)
	}
}
