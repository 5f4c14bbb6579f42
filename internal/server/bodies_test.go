package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// bodyServer is a server running okRun with max_concurrent 2 and a queue
// of 32, the case, and its test server.
func bodyServer(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.MaxConcurrent, cfg.Server.Queue = 2, 32
	s := New(cfg, okRun, nil)
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = s.HTTPServer()
	ts.Start()
	t.Cleanup(ts.Close)
	return s, ts
}

// stalledBody opens a connection to addr and sends a run's headers
// declaring declared bytes of body, then sent bytes of it, and stops.
func stalledBody(t *testing.T, addr string, declared, sent int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := `{"code": "`
	fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s", declared, head)
	if _, err := io.WriteString(c, strings.Repeat("a", sent-len(head))); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never %s", what)
		}
	}
}

// TestAPIStalledBodiesHoldNoRunSlot: 16 clients that declare 24 MiB of
// body and stop short of it hold no run slot: a 17th client's run is
// answered while all 16 are still being read, unanswered.
func TestAPIStalledBodiesHoldNoRunSlot(t *testing.T) {
	_, ts := bodyServer(t)
	addr := strings.TrimPrefix(ts.URL, "http://")
	const stalled = 16
	answered := make(chan int, stalled)
	for i := range stalled {
		c := stalledBody(t, addr, 24<<20, 256<<10)
		go func() {
			// Anything from the server (an answer, the end) is an
			// answer to a client that has not sent its body.
			if n, err := c.Read(make([]byte, 1)); n > 0 || !isClosedHere(err) {
				answered <- i
			}
		}()
	}
	// All 16 in the server's hands: being read (or, as before, holding
	// run slots and waiting for them, 2 and 14).
	waitFor(t, "the 16 stalled clients taken in", func() bool {
		return gauge(t, ts.URL, "agentrun_bodies_reading") == stalled || gauge(t, ts.URL, "agentrun_queued") == stalled-2
	})

	resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "print(7)"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "print(7)") {
		t.Fatalf("the 17th client's run: %d %s", resp.StatusCode, b)
	}
	select {
	case i := <-answered:
		t.Fatalf("stalled client %d was answered before the 17th client's run", i)
	default:
	}
	if n := gauge(t, ts.URL, "agentrun_bodies_reading"); n != stalled {
		t.Fatalf("%d bodies being read after the 17th client's run; want all %d stalled ones still", n, stalled)
	}
	// The budget holds what they sent, not what they declared.
	if used := gauge(t, ts.URL, "agentrun_body_bytes"); used > stalled*2*(256<<10)+stalled*(64<<10) {
		t.Errorf("the stalled bodies hold %d bytes of the budget; want at most twice what they sent", used)
	}
}

// gauge is the value of the series name on GET /metrics, -1 if none.
func gauge(t *testing.T, url, name string) int64 {
	t.Helper()
	for _, l := range strings.Split(metricsText(t, url), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var n int64
			fmt.Sscan(v, &n)
			return n
		}
	}
	return -1
}

// isClosedHere says whether err is the test closing its own connection.
func isClosedHere(err error) bool {
	return err != nil && strings.Contains(err.Error(), "use of closed network connection")
}

// TestAPIBodyBudget: a body that would take the body budget past its
// bound is refused 503 with Retry-After, counted; with the budget's part
// for large bodies full, a small one goes on; the budget comes back when
// the stalled clients leave, and the refused body then runs.
func TestAPIBodyBudget(t *testing.T) {
	s, ts := bodyServer(t)
	// 1 MiB: 896 KiB for any body, the last 128 KiB for small ones.
	s.bodies.max.Store(1 << 20)
	addr := strings.TrimPrefix(ts.URL, "http://")
	// 500 KiB of 2 MiB, in chunks of 4, 4, 8, 16, 32, 64, 128 and 256 KiB.
	first := stalledBody(t, addr, 2<<20, 500<<10)
	waitFor(t, "the first stalled body read", func() bool { return s.bodies.used.Load() == 512<<10 })

	post := func(body string) (int, string, string) {
		resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
	}
	// 700 KiB fit in the budget alone (the last chunk 188 KiB and 1 byte),
	// not beside the stalled body.
	big := `{"code": "` + strings.Repeat("a", 700<<10-12) + `"}`
	if code, retry, b := post(big); code != http.StatusServiceUnavailable || retry != "1" || !strings.Contains(b, "task bodies") {
		t.Fatalf("700 KiB with 512 KiB of the 1 MiB budget held: %d (Retry-After %q) %s; want 503 with Retry-After", code, retry, b)
	}
	// A second one of 384 KiB - 1 byte, all but its last byte: 256 KiB of
	// chunks and the last 128 KiB; the large bodies' part is full.
	second := stalledBody(t, addr, 384<<10-1, 384<<10-2)
	waitFor(t, "the second stalled body read", func() bool { return s.bodies.used.Load() == 896<<10 })
	if code, _, b := post(`{"code": "print(7)"}`); code != http.StatusOK {
		t.Fatalf("a small task beside the stalled bodies: %d %s", code, b)
	}
	if code, _, b := post(`{"code": "` + strings.Repeat("a", 100<<10) + `"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("100 KiB beside the stalled bodies: %d %.200s; want 503", code, b)
	}
	if m := metricsText(t, ts.URL); !strings.Contains(m, `agentrun_quota_refusals_total{quota="body_memory"} 2`) {
		t.Errorf("the refusals are not counted:\n%s", m)
	}
	first.Close()
	second.Close()
	waitFor(t, "the budget given back", func() bool { return s.bodies.used.Load() == 0 && s.bodies.reading.Load() == 0 })
	if code, _, b := post(big); code != http.StatusOK {
		t.Fatalf("700 KiB with the budget free: %d %.200s", code, b)
	}
	if used := s.bodies.used.Load(); used != 0 {
		t.Errorf("%d bytes of the budget held after the runs", used)
	}
}

// TestQueueRefusalTakesNoQuota: a run refused for want of a run slot (the
// queue full) never ran, and is not counted against its session's
// runs_per_minute, on either door: a client that tries again after
// Retry-After runs once a slot is free.
func TestQueueRefusalTakesNoQuota(t *testing.T) {
	release := make(chan struct{})
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.MaxConcurrent, cfg.Server.Queue, cfg.Server.Quota.RunsPerMinute = 1, 0, 1
	busy := busyRun(release)
	s := New(cfg, func(ctx context.Context, p *task.Plan, h runapi.Hooks) *result.Result {
		if string(p.Code) == "busy" {
			return busy(ctx, p, h)
		}
		return okRun(ctx, p, h)
	}, nil)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	go s.RunTask(context.Background(), []byte(`{"code": "busy", "session": "a"}`))
	waitRunning(t, ts.URL, 1)
	for range 3 {
		if _, err := s.RunTask(context.Background(), []byte(`{"code": "x", "session": "b"}`)); err == nil || httpStatus(err.(*runapi.Refusal).Kind()) != http.StatusServiceUnavailable {
			t.Fatalf("RunTask with the slot taken: %v; want 503", err)
		}
		if code := send(t, http.MethodPost, ts.URL+"/v1/runs", "application/json", `{"code": "x", "session": "b"}`, nil); code != http.StatusServiceUnavailable {
			t.Fatalf("POST /v1/runs with the slot taken: %d; want 503", code)
		}
	}
	close(release)
	waitRunning(t, ts.URL, 0)
	if _, err := s.RunTask(context.Background(), []byte(`{"code": "x", "session": "b"}`)); err != nil {
		t.Fatalf("RunTask with the slot free, after refusals for a full queue: %v", err)
	}
}
