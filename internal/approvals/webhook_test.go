package approvals

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/test/testenv"
)

// verify says whether sig is Sign(secret, body), in constant time: what a
// receiver checks before it believes a body.
func verify(secret, body []byte, sig string) bool {
	return hmac.Equal([]byte(sig), []byte(Sign(secret, body)))
}

// secretFile writes a root-only secret file (the owner must be root: the
// test skips otherwise).
func secretFile(t *testing.T, secret string) string {
	t.Helper()
	testenv.RequireRoot(t) // the webhook's secret file must be root's
	p := filepath.Join(t.TempDir(), "hook-secret")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func fast(t *testing.T) {
	old := [3]any{attemptTimeout, attempts, backoff}
	attemptTimeout, attempts, backoff = 2*time.Second, 3, 10*time.Millisecond
	t.Cleanup(func() {
		attemptTimeout, attempts, backoff = old[0].(time.Duration), old[1].(int), old[2].(time.Duration)
	})
}

// TestWebhookSignsAndRetries: a hold reaches the webhook signed with the
// secret over the exact body, after two failed attempts.
func TestWebhookSignsAndRetries(t *testing.T) {
	fast(t)
	file := secretFile(t, "s3cret")
	var n atomic.Int32
	got := make(chan *http.Request, 1)
	bodies := make(chan []byte, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) < 3 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
	}))
	defer ts.Close()
	w := NewWebhook()
	defer w.Close()
	h := Hold{Run: "ar-1", ID: "ap-1", Service: "api", Method: "POST", URL: "https://x/y", BodyExcerpt: `\x1b[2J`,
		Session: "s", ExpiresAt: time.Now().Add(time.Minute)}
	if !w.Send(context.Background(), Target{URL: ts.URL, SecretFile: file}, h) {
		t.Fatal("Send refused")
	}
	select {
	case r := <-got:
		b := <-bodies
		sig := r.Header.Get(SignatureHeader)
		if !verify([]byte("s3cret"), b, sig) || verify([]byte("other"), b, sig) {
			t.Errorf("signature %q does not verify the body %s", sig, b)
		}
		if r.Method != "POST" || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s with content type %q", r.Method, r.Header.Get("Content-Type"))
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no hold after %d attempts", n.Load())
	}
}

// TestWebhookNoRedirect: a webhook answering with a redirect is not
// followed; after its attempts the hold is given up on.
func TestWebhookNoRedirect(t *testing.T) {
	fast(t)
	file := secretFile(t, "k")
	var followed atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { followed.Add(1) }))
	defer other.Close()
	var tries atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		http.Redirect(w, r, other.URL, http.StatusTemporaryRedirect)
	}))
	defer hook.Close()
	w := NewWebhook()
	defer w.Close()
	gaveUp := logged(w)
	w.Send(context.Background(), Target{URL: hook.URL, SecretFile: file}, Hold{ID: "ap-2", ExpiresAt: time.Now().Add(time.Minute)})
	waitFor(t, gaveUp)
	if tries.Load() != int32(attempts) || followed.Load() != 0 {
		t.Errorf("%d attempts, %d followed redirects; want %d and 0", tries.Load(), followed.Load(), attempts)
	}
}

// TestWebhookSecretFileMustBeRoots: a secret others may read is refused,
// and nothing is sent.
func TestWebhookSecretFileMustBeRoots(t *testing.T) {
	fast(t)
	file := secretFile(t, "k")
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer hook.Close()
	w := NewWebhook()
	defer w.Close()
	gaveUp := logged(w)
	w.Send(context.Background(), Target{URL: hook.URL, SecretFile: file}, Hold{ID: "ap-3", ExpiresAt: time.Now().Add(time.Minute)})
	waitFor(t, gaveUp)
	if hits.Load() != 0 {
		t.Errorf("the webhook got %d posts signed with a secret others can read", hits.Load())
	}
}

// logged passes on what w logs.
func logged(w *Webhook) chan string {
	ch := make(chan string, 8)
	w.Logf = func(format string, args ...any) { ch <- format }
	return ch
}

// waitFor waits for a hold to be given up on.
func waitFor(t *testing.T, gaveUp chan string) {
	t.Helper()
	select {
	case <-gaveUp:
	case <-time.After(30 * time.Second):
		t.Fatal("not given up on")
	}
}

// A webhook's receiver (and the page) can tell a body shown whole from
// one shown only in part: a program cannot put a harmless start before
// what it means to send and have it read as the whole.
func TestHoldSaysWhenTheBodyIsCut(t *testing.T) {
	for _, cut := range []bool{true, false} {
		h := NewHold(context.Background(), "ar-1", "", Approval{ID: "ap-1", BodyExcerpt: "harmless", BodyCut: cut})
		b, err := json.Marshal(h)
		if want := fmt.Sprintf(`"body_cut":%v`, cut); err != nil || !strings.Contains(string(b), want) {
			t.Errorf("hold of a body cut %v: %s; want %s", cut, b, want)
		}
	}
}

// TestWebhookLogsNoSecretOfTheURL: a webhook's path, query and user info
// may carry a secret; a hold given up on is logged with the URL's scheme
// and host only, whether the webhook answered badly or could not be
// reached (net/http's errors name the URL whole).
func TestWebhookLogsNoSecretOfTheURL(t *testing.T) {
	fast(t)
	attempts = 1
	file := secretFile(t, "k")
	answers := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer answers.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	for name, base := range map[string]string{"answers 500": answers.URL, "unreachable": gone.URL} {
		t.Run(name, func(t *testing.T) {
			host := strings.TrimPrefix(base, "http://")
			hook := "http://hookuser:hookpass@" + host + "/hooks/pathsecret?token=querysecret"
			w := NewWebhook()
			defer w.Close()
			lines := make(chan string, 8)
			w.Logf = func(format string, args ...any) { lines <- fmt.Sprintf(format, args...) }
			w.Send(context.Background(), Target{URL: hook, SecretFile: file}, Hold{ID: "ap-4", Run: "ar-4", ExpiresAt: time.Now().Add(time.Minute)})
			var line string
			select {
			case line = <-lines:
			case <-time.After(30 * time.Second):
				t.Fatal("not given up on")
			}
			if !strings.Contains(line, "webhook http://"+host+"/…: ") {
				t.Errorf("logged %q; want the webhook as http://%s/…", line, host)
			}
			for _, secret := range []string{"pathsecret", "querysecret", "hookuser", "hookpass", "/hooks"} {
				if strings.Contains(line, secret) {
					t.Errorf("logged %q: it shows %q of the webhook's URL", line, secret)
				}
			}
		})
	}
}

// A run that holds requests in a flood, faster than the webhook takes
// them, delays only its own: another run's hold is announced in its turn,
// while the flood's past its share of the queue are refused.
func TestWebhookFairShare(t *testing.T) {
	fast(t)
	file := secretFile(t, "s3cret")
	other := make(chan Hold, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h Hold
		json.NewDecoder(r.Body).Decode(&h)
		if h.Run == "ar-flood" {
			time.Sleep(50 * time.Millisecond) // a webhook slower than the flood
			return
		}
		other <- h
	}))
	defer ts.Close()
	w := NewWebhook()
	defer w.Close()
	tgt := Target{URL: ts.URL, SecretFile: file}
	ctx := context.Background()
	sent := 0
	for i := range 2 * queueSize {
		if w.Send(ctx, tgt, Hold{Run: "ar-flood", ID: fmt.Sprintf("ap-%d", i), ExpiresAt: time.Now().Add(time.Minute)}) {
			sent++
		}
	}
	if sent > runQueue+senders {
		t.Errorf("flooding run queued %d holds; want at most its share, %d (and %d being sent)", sent, runQueue, senders)
	}
	if !w.Send(ctx, tgt, Hold{Run: "ar-other", ID: "ap-other", ExpiresAt: time.Now().Add(time.Minute)}) {
		t.Fatal("another run's hold refused while one run floods")
	}
	select {
	case h := <-other:
		if h.ID != "ap-other" {
			t.Errorf("announced %+v; want ap-other", h)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("another run's hold not announced while one run floods")
	}
}

// A hold withdrawn (decided, timed out, its client gone) before a sender
// takes it is never announced.
func TestWebhookSkipsWithdrawn(t *testing.T) {
	fast(t)
	file := secretFile(t, "s3cret")
	gate := make(chan struct{})
	got := make(chan string, 16)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var h Hold
		json.NewDecoder(r.Body).Decode(&h)
		got <- h.ID
		if strings.HasPrefix(h.ID, "ap-busy") {
			<-gate
		}
	}))
	defer ts.Close()
	w := NewWebhook()
	defer w.Close()
	tgt := Target{URL: ts.URL, SecretFile: file}
	hold := func(ctx context.Context, run, id string) {
		if !w.Send(ctx, tgt, Hold{Run: run, ID: id, ExpiresAt: time.Now().Add(time.Minute)}) {
			t.Fatalf("Send %s refused", id)
		}
	}
	// Every sender busy, then a hold withdrawn while it waits.
	for i := range senders {
		hold(context.Background(), fmt.Sprintf("ar-%d", i), fmt.Sprintf("ap-busy-%d", i))
		<-got
	}
	withdrawn, cancel := context.WithCancel(context.Background())
	hold(withdrawn, "ar-x", "ap-withdrawn")
	hold(context.Background(), "ar-x", "ap-live")
	cancel()
	close(gate)
	select {
	case id := <-got:
		if id != "ap-live" {
			t.Errorf("announced %s; want ap-live only", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ap-live not announced")
	}
	w.Close()
	ts.Close()
	close(got)
	for id := range got {
		t.Errorf("announced %s too", id)
	}
}

// TestWebhookToolHold: a held tool call reaches the webhook signed as a
// request does, with its kind, tool server, tool and arguments, the
// program's hostile bytes as their visible escapes (no raw control,
// bidirectional or zero-width character in the body), and no method or
// URL of a request; a request's hold has no kind at all.
func TestWebhookToolHold(t *testing.T) {
	fast(t)
	file := secretFile(t, "s3cret")
	got := make(chan []byte, 1)
	sigs := make(chan string, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sigs <- r.Header.Get(SignatureHeader)
		got <- b
	}))
	defer ts.Close()
	w := NewWebhook()
	defer w.Close()
	a := Approval{ID: "ap-t", Kind: KindTool, Service: "github",
		Tool: untrusted.Text("create_issue\n\x1b[2Jagentrun: approved"), Arguments: untrusted.Text("{\"title\":\"\u202eok\u200b\"}")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !w.Send(ctx, Target{URL: ts.URL, SecretFile: file}, NewHold(ctx, "ar-1", "s", a)) {
		t.Fatal("Send refused")
	}
	var b []byte
	select {
	case b = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("no hold")
	}
	if sig := <-sigs; !verify([]byte("s3cret"), b, sig) {
		t.Errorf("signature %q does not verify the body %s", sig, b)
	}
	if strings.ContainsAny(string(b), "\x1b\u202e\u200b") {
		t.Errorf("body %q carries a raw control or format character", b)
	}
	var h map[string]any
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"run": "ar-1", "id": "ap-t", "kind": "tool", "service": "github", "session": "s",
		"tool": `create_issue\n\x1b[2Jagentrun: approved`, "arguments": `{"title":"\u202eok\u200b"}`,
		"method": "", "url": "", "body_excerpt": "", "body_cut": false}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("hold %s = %#v; want %#v", k, h[k], v)
		}
	}
	rb, _ := json.Marshal(NewHold(ctx, "ar-1", "", Approval{ID: "ap-r", Method: "GET", URL: "https://x/"}))
	if strings.Contains(string(rb), `"kind"`) || strings.Contains(string(rb), `"tool"`) || strings.Contains(string(rb), `"arguments"`) {
		t.Errorf("a request's hold %s carries a tool call's fields", rb)
	}
}
