package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

func TestQuotaRunsPerMinute(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQuotas(2, 0, func() time.Time { return now })
	for i := range 2 {
		release, _, err := q.acquire("s")
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		release()
		now = now.Add(10 * time.Second)
	}
	_, retry, err := q.acquire("s")
	if err == nil || !strings.Contains(err.Error(), "2 runs per minute") {
		t.Fatalf("third run in a minute: %v", err)
	}
	if retry != 40*time.Second {
		t.Errorf("retry after %v; want 40s (when the first run leaves the window)", retry)
	}
	if _, _, err := q.acquire("other"); err != nil {
		t.Errorf("another session: %v", err)
	}
	now = now.Add(40 * time.Second)
	if _, _, err := q.acquire("s"); err != nil {
		t.Errorf("after the window moved: %v", err)
	}
}

func TestQuotaConcurrent(t *testing.T) {
	q := newQuotas(0, 1, time.Now)
	release, _, err := q.acquire("")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.acquire(""); err == nil || !strings.Contains(err.Error(), "1 runs going on") {
		t.Fatalf("second concurrent run: %v", err)
	}
	release()
	release() // twice is harmless
	if _, _, err := q.acquire(""); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if _, _, err := q.acquire(""); err == nil {
		t.Fatal("a double release freed two slots")
	}
}

func TestQuotaTableStaysBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQuotas(1, 0, func() time.Time { return now })
	for i := range 3 * sweepAt {
		release, _, err := q.acquire(strings.Repeat("x", i%50) + string(rune('a'+i%26)) + time.Duration(i).String())
		if err != nil {
			t.Fatal(err)
		}
		release()
		now = now.Add(time.Second)
	}
	if len(q.sessions) > sweepAt+int(quotaWindow/time.Second) {
		t.Fatalf("%d sessions kept; idle ones should be dropped", len(q.sessions))
	}
}

// TestQuotaSweepBounded: a table of sessions that all stay in their
// window is not scanned again on every admission once it is past sweepAt
// (each admission scanned it all, under the lock).
func TestQuotaSweepBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQuotas(1, 0, func() time.Time { return now })
	n := 4 * sweepAt
	for i := range n {
		release, _, err := q.acquire(fmt.Sprintf("s-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	// Doubling from sweepAt: a sweep at 1, 2 and 4 times sweepAt.
	if q.sweeps > 3 {
		t.Errorf("%d sweeps for %d sessions in their window, want at most 3", q.sweeps, n)
	}
	// Once their window is past, the next sweep drops them.
	now = now.Add(quotaWindow)
	for i := range 2 * n {
		release, _, err := q.acquire(fmt.Sprintf("t-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	if len(q.sessions) > 2*n {
		t.Errorf("%d sessions kept; the idle ones should have been dropped", len(q.sessions))
	}
}

func testServer(t *testing.T, mutate func(*config.Config), run runapi.Func) *httptest.Server {
	t.Helper()
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	if mutate != nil {
		mutate(cfg)
	}
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = New(cfg, run, nil).HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	return ts
}

func okRun(_ context.Context, p *task.Plan, _ runapi.Hooks) *result.Result {
	return &result.Result{ID: "ar-test", Stdout: string(p.Code)}
}

func TestAPIAnswers(t *testing.T) {
	ts := testServer(t, nil, okRun)
	for _, tc := range []struct {
		name, body string
		status     int
		field      string
	}{
		{"result", `{"code": "hi"}`, 200, ""},
		{"not json", `{"code": `, 400, "code"},
		{"unknown field", `{"code": "x", "colour": 1}`, 400, "colour"},
		{"above policy", `{"code": "x", "limits": {"pids": 100000}}`, 403, "limits.pids"},
		{"too large", `{"code": "` + strings.Repeat("a", task.MaxTaskBytes) + `"}`, 413, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d; want %d", resp.StatusCode, tc.status)
			}
			if tc.status == 200 {
				var res result.Result
				if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || res.Stdout != "hi" {
					t.Fatalf("result %+v, %v", res, err)
				}
				return
			}
			var e APIError
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error == "" || e.Field != tc.field {
				t.Fatalf("error body %+v, %v; want field %q", e, err, tc.field)
			}
		})
	}
	resp, err := http.Get(ts.URL + "/v1/runs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/runs: %d", resp.StatusCode)
	}
}

func TestAPIFailedRunIs500(t *testing.T) {
	ts := testServer(t, nil, func(context.Context, *task.Plan, runapi.Hooks) *result.Result {
		return &result.Result{Error: "image \"x\": not found"}
	})
	resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res result.Result
	if resp.StatusCode != 500 || json.NewDecoder(resp.Body).Decode(&res) != nil || res.Error == "" {
		t.Fatalf("status %d, %+v; want 500 with the result", resp.StatusCode, res)
	}
}

func TestAPIToken(t *testing.T) {
	ts := testServer(t, func(c *config.Config) { c.Server.Token = "t0k" }, okRun)
	for auth, want := range map[string]int{"": 401, "Bearer nope": 401, "t0k": 401, "Bearer t0k": 200} {
		req, _ := http.NewRequest("GET", ts.URL+"/healthz", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Authorization %q: %d; want %d", auth, resp.StatusCode, want)
		}
	}
}

// TestAPIQueueGivesUpWithClient: a queued request whose client leaves
// frees its queue place.
func TestAPIQueueGivesUpWithClient(t *testing.T) {
	block := make(chan struct{})
	ts := testServer(t, func(c *config.Config) { c.Server.MaxConcurrent, c.Server.Queue = 1, 1 },
		func(ctx context.Context, p *task.Plan, _ runapi.Hooks) *result.Result {
			select {
			case <-block:
			case <-ctx.Done():
			}
			return &result.Result{}
		})
	defer close(block)
	go http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "x", "session": "a"}`))
	for deadline := time.Now().Add(5 * time.Second); ; {
		var h Health
		resp, err := http.Get(ts.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if h.Running == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first run never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/runs", strings.NewReader(`{"code": "x", "session": "b"}`))
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("queued request answered while the slot was busy")
	}
	time.Sleep(2 * peerPoll) // the server checks a waiting client's connection this often
	// Its queue place is free again: the next request waits, not 503.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	req, _ = http.NewRequestWithContext(ctx2, "POST", ts.URL+"/v1/runs", strings.NewReader(`{"code": "x", "session": "c"}`))
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d; want the request to wait in the queue", resp.StatusCode)
	}
}

// TestAPIUnknownSessionTakesNoQuota: keep_workspace on a session that
// does not exist is 404 every time, before any quota is counted: made-up
// ids neither use up a session's quota nor fill the quota table.
func TestAPIUnknownSessionTakesNoQuota(t *testing.T) {
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.Quota.RunsPerMinute = 1
	cfg.StoreDir, cfg.StateDir = t.TempDir(), t.TempDir()
	srv := New(cfg, okRun, nil)
	var err error
	if srv.Sessions, err = session.Open(cfg, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.HTTPServer().Handler)
	defer ts.Close()
	for i := range 3 {
		body := fmt.Sprintf(`{"code": "x", "session": "ss-%032x", "keep_workspace": true}`, i%2)
		resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("run %d in an unknown session: status %d, want 404", i, resp.StatusCode)
		}
	}
	srv.quotas.mu.Lock()
	defer srv.quotas.mu.Unlock()
	if n := len(srv.quotas.sessions); n != 0 {
		t.Errorf("the quota table holds %d sessions after runs in unknown ones", n)
	}
}

// TestAPIAnswersBeforeTearDown: the client has the result as soon as it is
// final, while the sandbox is still being torn down.
func TestAPIAnswersBeforeTearDown(t *testing.T) {
	tearDown := make(chan struct{})
	ts := testServer(t, nil, func(_ context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		hooks.Result(&result.Result{ID: "ar-early", Stdout: "early"})
		<-tearDown
		return &result.Result{ID: "ar-early", Stdout: "early"}
	})
	defer close(tearDown)
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The whole body, to its end, while the run is still tearing down.
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var res result.Result
	if err := json.Unmarshal(b, &res); err != nil || res.Stdout != "early" {
		t.Fatalf("result %+v, %v", res, err)
	}
}

func TestClient(t *testing.T) {
	ts := testServer(t, func(c *config.Config) { c.Server.Token = "t0k"; c.Server.Quota.RunsPerMinute = 1 }, okRun)
	addr := "tcp://" + strings.TrimPrefix(ts.URL, "http://")
	c, err := NewClient(addr, "t0k")
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Run(context.Background(), []byte(`{"code": "hello"}`))
	if err != nil || res.Stdout != "hello" {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	if h, err := c.Health(context.Background()); err != nil || h.Status != "ok" {
		t.Fatalf("Health = %+v, %v", h, err)
	}
	if _, err := c.Run(context.Background(), []byte(`{"code": "again"}`)); err == nil ||
		!strings.Contains(err.Error(), "429") || !strings.Contains(err.Error(), "runs per minute") || !strings.Contains(err.Error(), "retry after") {
		t.Errorf("over quota: %v", err)
	}
	_, err = c.Run(context.Background(), []byte(`{"code": 1}`))
	if ref, ok := err.(*runapi.Refusal); !ok || httpStatus(ref.Kind()) != 400 || ref.Field != "code" || !strings.Contains(err.Error(), "400") {
		t.Errorf("bad task: %#v; want a *runapi.Refusal naming code", err)
	}
	bad, _ := NewClient(addr, "wrong")
	if _, err := bad.Run(context.Background(), []byte(`{"code": "x"}`)); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v", err)
	}
	if _, err := bad.Health(context.Background()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("health with the wrong token: %v", err)
	}
	for _, a := range []string{"unix://relative.sock", "http://x", "tcp://nohostport"} {
		if _, err := NewClient(a, ""); err == nil {
			t.Errorf("NewClient(%q) accepted", a)
		}
	}
}

// TestAPIStream: with ?stream=1 the output comes as NDJSON lines while the
// run goes on, then the result, also while the tear-down goes on.
func TestAPIStream(t *testing.T) {
	step := make(chan struct{})
	tearDown := make(chan struct{})
	ts := testServer(t, nil, func(_ context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		hooks.Output("stdout", []byte("one\n"))
		<-step // the client must see "one" before the run goes on
		hooks.Output("stderr", []byte("two\xff"))
		res := &result.Result{ID: "ar-s", Stdout: "one\n", Stderr: "two"}
		hooks.Result(res)
		<-tearDown
		return res
	})
	defer close(tearDown)
	resp, err := http.Post(ts.URL+"/v1/runs?stream=1", "application/json", strings.NewReader(`{"code": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	dec := json.NewDecoder(resp.Body)
	var ev Event
	if err := dec.Decode(&ev); err != nil || ev.Event != "stdout" || ev.Data != "one\n" {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	close(step)
	if err := dec.Decode(&ev); err != nil || ev.Event != "stderr" || ev.Data != "two\ufffd" {
		t.Fatalf("second event %+v, %v", ev, err)
	}
	if err := dec.Decode(&ev); err != nil || ev.Event != "result" || ev.Result == nil || ev.Result.ID != "ar-s" {
		t.Fatalf("last event %+v, %v", ev, err)
	}

	bad, err := http.Post(ts.URL+"/v1/runs?stream=yes", "application/json", strings.NewReader(`{"code": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	bad.Body.Close()
	if bad.StatusCode != 400 {
		t.Errorf("stream=yes: status %d; want 400", bad.StatusCode)
	}
}

// TestAPIClientNotReading: a client that sends a task and never reads the
// answer loses it after the write deadline; its slot comes free.
func TestAPIClientNotReading(t *testing.T) {
	old := writeDeadline
	writeDeadline = 200 * time.Millisecond
	defer func() { writeDeadline = old }()
	chunk := []byte(strings.Repeat("x", 64<<10))
	ts := testServer(t, func(c *config.Config) { c.Server.MaxConcurrent, c.Server.Queue = 1, 0 },
		func(_ context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
			for range 256 { // 16 MiB: far more than the socket buffers hold
				if hooks.Output != nil {
					hooks.Output("stdout", chunk)
				}
			}
			res := &result.Result{ID: "ar-big"}
			if hooks.Result != nil {
				hooks.Result(res)
			}
			return res
		})
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"code": "x"}`
	fmt.Fprintf(conn, "POST /v1/runs?stream=1 HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Never read. The run starts, and its slot must come free.
	running := func() int64 {
		var h Health
		resp, err := http.Get(ts.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(&h)
		return h.Running
	}
	for _, want := range []int64{1, 0} {
		deadline := time.Now().Add(10 * time.Second)
		for running() != want {
			if time.Now().After(deadline) {
				t.Fatalf("runs going on never became %d", want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// blockingRun answers at once and tears down until release closes, as a
// run tearing down its sandbox does (whether or not its client is still
// there).
func blockingRun(release chan struct{}) runapi.Func {
	return func(ctx context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		res := &result.Result{ID: "ar-b", Stdout: string(p.Code)}
		if hooks.Result != nil {
			hooks.Result(res)
		}
		<-release
		return res
	}
}

// waitRunning polls /healthz until n runs go on.
func waitRunning(t *testing.T, url string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var h Health
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if h.Running == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never %d runs going on: %+v", n, h)
		}
	}
}

// TestAPIBodyDeadline: a client that stops sending its body is answered
// 408 within the body deadline, and the run slot it never took is free.
func TestAPIBodyDeadline(t *testing.T) {
	old := bodyDeadline
	bodyDeadline = 300 * time.Millisecond
	defer func() { bodyDeadline = old }()
	ts := testServer(t, func(c *config.Config) { c.Server.MaxConcurrent, c.Server.Queue = 1, 0 }, okRun)
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{\"code\": ")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(conn)
	if !strings.HasPrefix(string(b), "HTTP/1.1 408") || !strings.Contains(string(b), "not sent within") {
		t.Fatalf("a stalled body got %q; want 408 within the deadline", b)
	}
	resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the stalled client: status %d; want its slot free", resp.StatusCode)
	}
}

// TestHTTPServerHeaderDeadline: a client that sends its headers a byte at
// a time is cut off at the header deadline.
func TestHTTPServerHeaderDeadline(t *testing.T) {
	old := headerTimeout
	headerTimeout = 300 * time.Millisecond
	defer func() { headerTimeout = old }()
	cfg := config.Default()
	srv := New(cfg, okRun, nil).HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/runs HTTP/1.1\r\n")
	for time.Since(start) < 20*time.Second {
		if _, err := conn.Write([]byte("X")); err != nil {
			break
		}
		conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
	}
	// Far above the deadline, for a loaded host, and far below the 20 s
	// the client goes on for without it.
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a slow header was still read after %v; want it cut at %v", d, headerTimeout)
	}
}

// TestAPIQuotaFreedAtAnswer: a session with one concurrent run may send its
// next run as soon as it has the answer, while the sandbox of the first is
// still being torn down.
func TestAPIQuotaFreedAtAnswer(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	ts := testServer(t, func(c *config.Config) { c.Server.MaxConcurrent, c.Server.Quota.Concurrent = 4, 1 }, blockingRun(release))
	for i := range 3 {
		resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "x", "session": "s"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("run %d, one at a time: status %d: %s", i, resp.StatusCode, b)
		}
	}
}

// TestAPIStreamKeepsCharacters: a UTF-8 character cut across two output
// chunks comes whole in one event; bytes that are not UTF-8 come in
// data_base64 as well.
func TestAPIStreamKeepsCharacters(t *testing.T) {
	text := strings.Repeat("日本語", 50)
	ts := testServer(t, nil, func(_ context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		for b := []byte(text); len(b) > 0; {
			n := min(7, len(b))
			hooks.Output("stdout", b[:n])
			b = b[n:]
		}
		hooks.Output("stderr", []byte("bad \xff\xe6\x97")) // an invalid byte, then a cut-off character
		res := &result.Result{ID: "ar-u", Stdout: text}
		hooks.Result(res)
		return res
	})
	resp, err := http.Post(ts.URL+"/v1/runs?stream=1", "application/json", strings.NewReader(`{"code": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	var stdout strings.Builder
	var stderrRaw []byte
	for {
		var ev Event
		if err := dec.Decode(&ev); err != nil {
			break
		}
		switch ev.Event {
		case "stdout":
			if strings.ContainsRune(ev.Data, utf8.RuneError) || ev.DataBase64 != "" {
				t.Errorf("stdout event %+v: a character was cut", ev)
			}
			stdout.WriteString(ev.Data)
		case "stderr":
			raw := []byte(ev.Data)
			if ev.DataBase64 != "" {
				raw, _ = base64.StdEncoding.DecodeString(ev.DataBase64)
			}
			stderrRaw = append(stderrRaw, raw...)
		}
	}
	if stdout.String() != text {
		t.Errorf("streamed stdout %q; want %q", stdout.String(), text)
	}
	if string(stderrRaw) != "bad \xff\xe6\x97" {
		t.Errorf("streamed stderr bytes %q; want the exact bytes", stderrRaw)
	}
}

// TestAPIErrorsAreJSON: an unknown path or method gets a JSON error like
// every other refusal.
func TestAPIErrorsAreJSON(t *testing.T) {
	ts := testServer(t, nil, okRun)
	for _, tc := range []struct {
		method, path string
		status       int
	}{{"GET", "/nothing", 404}, {"GET", "/v1/runs", 405}, {"DELETE", "/healthz", 405}, {"POST", "/v1/run", 404}} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e APIError
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.status || err != nil || e.Error == "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: status %d, %+v, %v; want %d with a JSON error", tc.method, tc.path, resp.StatusCode, e, err, tc.status)
		}
	}
}

// TestHealthReportsPoolErrors: a pool image the server started without is
// in /healthz, and the status says so.
func TestHealthReportsPoolErrors(t *testing.T) {
	api := New(config.Default(), okRun, nil)
	api.PoolErrors = map[string]string{"registry.invalid/x": "pulling: no such host"}
	ts := httptest.NewServer(api.Handler())
	defer ts.Close()
	c, _ := NewClient("tcp://"+strings.TrimPrefix(ts.URL, "http://"), "")
	h, err := c.Health(context.Background())
	if err != nil || h.Status != "degraded" || h.Pool == nil || h.Pool.Errors["registry.invalid/x"] == "" {
		t.Fatalf("health %+v (pool %+v), %v; want degraded naming the image", h, h.Pool, err)
	}
}

// TestClientRetriesBusy: a 503 with Retry-After is tried again after it,
// at most MaxRetries times.
func TestClientRetriesBusy(t *testing.T) {
	release := make(chan struct{})
	ts := testServer(t, func(c *config.Config) { c.Server.MaxConcurrent, c.Server.Queue = 1, 0 }, busyRun(release))
	c, _ := NewClient("tcp://"+strings.TrimPrefix(ts.URL, "http://"), "")
	go c.Run(context.Background(), []byte(`{"code": "first"}`))
	waitRunning(t, ts.URL, 1)

	old := MaxRetries
	MaxRetries = 1
	if _, err := c.Run(context.Background(), []byte(`{"code": "x"}`)); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("busy past the retries: %v; want the 503", err)
	}
	MaxRetries = old
	time.AfterFunc(500*time.Millisecond, func() { close(release) })
	start := time.Now()
	res, err := c.Run(context.Background(), []byte(`{"code": "second"}`))
	if err != nil || res.Stdout != "second" {
		t.Fatalf("busy, then free: %+v, %v; want the run after a retry", res, err)
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("answered after %v: the retry did not wait for Retry-After", d)
	}
}

// busyRun holds its run slot, unanswered, until release closes: a run
// whose program goes on.
func busyRun(release chan struct{}) runapi.Func {
	return func(ctx context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		<-release
		return &result.Result{ID: "ar-busy", Stdout: string(p.Code)}
	}
}

// TestAPITearDownLeavesRunSlot: an answered run tears its sandbox down
// in a tear-down slot of its own, so the next request runs meanwhile; and
// with every tear-down slot taken (as many as run slots) an answered run
// keeps its run slot, so tear-downs never pile up past max_concurrent.
func TestAPITearDownLeavesRunSlot(t *testing.T) {
	tearDowns := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	var n atomic.Int64
	ts := testServer(t, func(c *config.Config) { c.Server.MaxConcurrent, c.Server.Queue = 1, 0 },
		func(_ context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
			res := &result.Result{ID: "ar-t", Stdout: string(p.Code)}
			hooks.Result(res)
			<-tearDowns[n.Add(1)-1]
			return res
		})
	var ended [3]sync.Once
	end := func(i int) { ended[i].Do(func() { close(tearDowns[i]) }) }
	t.Cleanup(func() { end(0); end(1); end(2) }) // before the server's
	post := func(code string) int {
		t.Helper()
		client := &http.Client{Timeout: 5 * time.Second}
		resp, err := client.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "`+code+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post("first"); got != 200 {
		t.Fatalf("first run: status %d", got)
	}
	waitRunning(t, ts.URL, 1) // answered, tearing down
	if got := post("second"); got != 200 {
		t.Fatalf("a run while the one before tears down: status %d; want it run (max_concurrent 1)", got)
	}
	waitRunning(t, ts.URL, 2)
	// The only tear-down slot is the first run's: the second keeps its
	// run slot as it tears down, and a third is refused (queue 0).
	if got := post("third"); got != http.StatusServiceUnavailable {
		t.Fatalf("a run with one run and one tear-down slot taken: status %d; want 503", got)
	}
	end(0)
	end(1)
	waitRunning(t, ts.URL, 0)
	end(2)
	if got := post("fourth"); got != 200 {
		t.Fatalf("a run once both tear-downs ended: status %d", got)
	}
}

// With no token set, another site open in the operator's browser cannot
// change anything through serve (behind a reverse proxy the browser
// reaches): its cross-site POST, PUT or DELETE is refused 403 on every
// path, /mcp's included, before any handler; a client that is no browser
// (no Sec-Fetch-Site, no Origin), a same-origin page and a cross-site GET
// pass.
func TestCrossSiteRefused(t *testing.T) {
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	var runs, mcps atomic.Int32
	s := New(cfg, func(ctx context.Context, p *task.Plan, h runapi.Hooks) *result.Result {
		runs.Add(1)
		return okRun(ctx, p, h)
	}, nil)
	s.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mcps.Add(1) }))
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = s.HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	do := func(method, path, body string, hdr map[string]string) int {
		return send(t, method, ts.URL+path, "text/plain", body, hdr)
	}
	body := `{"code":"hi"}`
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
		{"Origin": "https://evil.example"},
	} {
		for _, tc := range []struct{ method, path string }{
			{"POST", "/v1/runs"}, {"POST", "/v1/runs?stream=1"}, {"POST", "/v1/sessions"},
			{"DELETE", "/v1/sessions/s-1"}, {"PUT", "/v1/sessions/s-1/files/a"},
			{"POST", "/mcp"}, {"DELETE", "/mcp"}, {"POST", "/nowhere"},
		} {
			if code := do(tc.method, tc.path, body, hdr); code != 403 {
				t.Errorf("%s %s with %v: %d; want 403", tc.method, tc.path, hdr, code)
			}
		}
	}
	if runs.Load() != 0 || mcps.Load() != 0 {
		t.Fatalf("cross-site requests reached %d runs and %d MCP requests", runs.Load(), mcps.Load())
	}
	for _, hdr := range []map[string]string{nil, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}} {
		if code := do("POST", "/v1/runs", body, hdr); code != 200 {
			t.Errorf("POST /v1/runs with %v: %d; want 200", hdr, code)
		}
	}
	if code := do("POST", "/mcp", "", nil); code != 200 || runs.Load() != 3 || mcps.Load() != 1 {
		t.Errorf("plain POST /mcp: %d; %d runs, %d MCP requests; want 200, 3 and 1", code, runs.Load(), mcps.Load())
	}
	if code := do("GET", "/healthz", "", map[string]string{"Sec-Fetch-Site": "cross-site"}); code != 200 {
		t.Errorf("cross-site GET /healthz: %d; want 200", code)
	}
}

// send sends method url with body of type ctype and the headers hdr
// ("Host" the request's Host), and returns the answer's status.
func send(t *testing.T, method, url, ctype, body string, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdmitOrders: with every run slot taken and no queue, a task over
// its session's quota is refused as such (429), by RunTask and by POST
// /v1/runs alike: the task, read whole, is checked before the wait for a
// slot.
func TestAdmitOrders(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.MaxConcurrent, cfg.Server.Queue, cfg.Server.Quota.Concurrent = 1, 0, 1
	s := New(cfg, busyRun(release), nil)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	go s.RunTask(context.Background(), []byte(`{"code": "x", "session": "s"}`))
	waitRunning(t, ts.URL, 1)

	_, err := s.RunTask(context.Background(), []byte(`{"code": "x", "session": "s"}`))
	if ref, ok := err.(*runapi.Refusal); !ok || httpStatus(ref.Kind()) != http.StatusTooManyRequests {
		t.Errorf("RunTask over the quota with the slots taken: %v, want a 429 refusal", err)
	}
	if code := send(t, http.MethodPost, ts.URL+"/v1/runs", "application/json", `{"code": "x", "session": "s"}`, nil); code != http.StatusTooManyRequests {
		t.Errorf("POST /v1/runs over the quota with the slots taken: %d, want 429", code)
	}
}
