package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/server"
)

// TestE2BPooled: serve's pool serves the door's creates: with the pool's
// first shape (a run's) full, a first Sandbox.create moves it to a live
// sandbox's shape (a miss), the pool fills that, and the next create is
// taken from it (a hit).
func TestE2BPooled(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		s := startE2B(t, []string{"alice"}, map[string]any{"runtime": rt,
			"server": map[string]any{"listen": "tcp://127.0.0.1:0", "token": "not-e2b", "pool": map[string]any{pythonImage: 1}}})
		pool := func() server.PoolHealth {
			var h server.Health
			if code := s.get("/healthz", &h); code != 200 || h.Pool == nil {
				t.Fatalf("/healthz: %d %+v", code, h)
			}
			return *h.Pool
		}
		ready := func(what string) {
			t.Helper()
			for deadline := time.Now().Add(time.Minute); pool().Ready[pythonImage] < 1; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the pool made no sandbox %s: %+v", what, pool())
				}
			}
		}
		e2b := func(method, path, body string, want int) []byte {
			t.Helper()
			req, _ := http.NewRequest(method, s.base+"/e2b"+path, strings.NewReader(body))
			req.Header.Set("X-API-Key", s.keys["alice"])
			req.Header.Set("Content-Type", "application/json")
			resp, err := s.client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if resp.StatusCode != want {
				t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
			}
			return b
		}
		create := func() string {
			t.Helper()
			var sb struct{ SandboxID string }
			if err := json.Unmarshal(e2b("POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, 201), &sb); err != nil || sb.SandboxID == "" {
				t.Fatalf("create: %v %+v", err, sb)
			}
			return sb.SandboxID
		}
		ready("for runs")
		a := create()
		if p := pool(); p.Hits != 0 || p.Misses != 1 {
			t.Errorf("the first E2B sandbox: %+v, want a miss", p)
		}
		ready("of a live sandbox's shape after the first create")
		b := create()
		if p := pool(); p.Hits != 1 {
			t.Errorf("the second E2B sandbox was not taken from the pool: %+v", p)
		}
		e2b("DELETE", "/sandboxes/"+a, "", 204)
		e2b("DELETE", "/sandboxes/"+b, "", 204)
		s.stop()
		assertNoLeaks(t)
	})
}
