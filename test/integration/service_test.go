package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/test/testenv"
)

// scrape is GET /metrics parsed by the Prometheus text parser: each series
// as family{label="value",...} (labels sorted) to its value; a histogram
// gives its sample count.
func (s *served) scrape() map[string]float64 {
	s.t.Helper()
	resp, b := s.do("GET", "/metrics", "")
	if resp.StatusCode != 200 {
		s.t.Fatalf("GET /metrics: status %d: %s", resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		s.t.Fatalf("parsing /metrics: %v\n%s", err, b)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.Counter.GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.Gauge.GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

// waitPool waits until the server's pool has n sandboxes ready for image.
func (s *served) waitPool(image string, n int) {
	s.t.Helper()
	s.waitHealth(fmt.Sprintf("%d ready in the pool", n), func(h server.Health) bool {
		return h.Pool != nil && h.Pool.Ready[image] == n
	})
}

// waitIdle waits until serve has no run going on or waiting: an answer
// goes out before its sandbox is torn down, and the run counts until then.
func (s *served) waitIdle() {
	s.t.Helper()
	s.waitHealth("no run going on", func(h server.Health) bool { return h.Running == 0 && h.Queued == 0 })
}

// waitHealth waits up to 30 s until serve's /healthz satisfies ok.
func (s *served) waitHealth(what string, ok func(server.Health) bool) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var h server.Health
		s.get("/healthz", &h)
		if ok(h) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("serve never had %s: %+v; log: %s", what, h, s.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsCountWhatHappened: /metrics, scraped before and after a known
// mix of runs (ok, exit 3, timeout, OOM, refused by policy and by quota,
// denied egress, pool hits and a miss), moves each counter by exactly what
// happened. It needs the token like the rest of the API.
func TestMetricsCountWhatHappened(t *testing.T) {
	s := startServeWith(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": "", "runsc": map[string]any{"path": runscPath, "flags": []string{}},
		"policy": map[string]any{"local_images": []string{*imagesDir}, "memory": "512m"},
		"server": map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "m.sock"), "token": "metrics-token",
			"pool": map[string]int{pythonImage: 1}, "quota": map[string]any{"runs_per_minute": 1}}})

	s.token = ""
	if resp, _ := s.do("GET", "/metrics", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /metrics without the token: status %d, want 401", resp.StatusCode)
	}
	s.token = "metrics-token"

	before := s.scrape()
	run := func(session, task string, wantStatus int) *result.Result {
		t.Helper()
		var res result.Result
		task = strings.Replace(task, "{", fmt.Sprintf(`{"session": %q, `, session), 1)
		if resp := s.post(task, &res); resp.StatusCode != wantStatus {
			t.Fatalf("%s: status %d, want %d: %+v", task, resp.StatusCode, wantStatus, res)
		}
		return &res
	}
	// Pooled: each waits for the pool to hold a sandbox again, so that
	// each is a hit.
	s.waitPool(pythonImage, 1)
	run("ok", `{"code": "print(1)"}`, 200)
	s.waitPool(pythonImage, 1)
	if res := run("exit3", `{"code": "import sys; sys.exit(3)"}`, 200); res.ExitCode != 3 {
		t.Fatalf("exit: %+v", res)
	}
	s.waitPool(pythonImage, 1)
	if res := run("timeout", `{"code": "while True: pass", "limits": {"timeout": "1s"}}`, 200); !res.TimedOut {
		t.Fatalf("timeout: %+v", res)
	}
	// Cold: an allowlist is another shape than the pool's: a miss (the
	// pool keeps its shape, the more common one of the image's runs).
	denied := run("egress", `{"code": "import urllib.request\ntry:\n  urllib.request.urlopen('http://evil.example/', timeout=5)\nexcept Exception as e:\n  print(e)", "network": {"allow": ["allowed.example"]}}`, 200)
	var nDenied float64
	for _, d := range denied.Network.Denied {
		nDenied += float64(d.Count)
	}
	if nDenied == 0 || !strings.Contains(denied.Stdout, "403") {
		t.Fatalf("egress run: no denial: %+v", denied)
	}
	// Cold: another shape (memory) than the pool's: a miss.
	if res := run("oom", `{"code": "x = bytearray(200 << 20)", "limits": {"memory": "64m"}}`, 200); !res.OOMKilled {
		t.Fatalf("oom: %+v", res)
	}
	// Refused: above policy, then over session ok's quota of one a minute.
	var apiErr server.APIError
	if resp := s.post(`{"code": "print(1)", "limits": {"memory": "1g"}}`, &apiErr); resp.StatusCode != 403 {
		t.Fatalf("above policy: status %d", resp.StatusCode)
	}
	if resp := s.post(`{"code": "print(1)", "session": "ok"}`, &apiErr); resp.StatusCode != 429 {
		t.Fatalf("over quota: status %d", resp.StatusCode)
	}
	s.waitIdle()
	after := s.scrape()

	img := fmt.Sprintf("{image=%q}", pythonImage)
	want := map[string]float64{
		`agentrun_runs_total{outcome="ok",runtime="libcontainer"}`:           2,
		`agentrun_runs_total{outcome="exit_nonzero",runtime="libcontainer"}`: 1,
		`agentrun_runs_total{outcome="timeout",runtime="libcontainer"}`:      1,
		`agentrun_runs_total{outcome="oom",runtime="libcontainer"}`:          1,
		`agentrun_runs_total{outcome="refused",runtime="libcontainer"}`:      2,
		`agentrun_runs_total{outcome="error",runtime="libcontainer"}`:        0,
		`agentrun_runs_total{outcome="ok",runtime="runsc"}`:                  0,
		`agentrun_quota_refusals_total{quota="runs_per_minute"}`:             1,
		`agentrun_quota_refusals_total{quota="concurrent"}`:                  0,
		`agentrun_quota_refusals_total{quota="queue"}`:                       0,
		`agentrun_egress_total{decision="denied"}`:                           nDenied,
		`agentrun_egress_total{decision="allowed"}`:                          0,
		`agentrun_setup_seconds{path="pool"}`:                                3,
		`agentrun_setup_seconds{path="cold"}`:                                2,
		`agentrun_run_duration_seconds{path="pool"}`:                         3,
		`agentrun_run_duration_seconds{path="cold"}`:                         2,
		"agentrun_pool_hits_total" + img:                                     3,
		"agentrun_pool_misses_total" + img:                                   2,
	}
	for series, delta := range want {
		a, ok := after[series]
		if !ok {
			t.Errorf("%s: not in /metrics", series)
			continue
		}
		if got := a - before[series]; got != delta {
			t.Errorf("%s moved by %v, want %v", series, got, delta)
		}
	}
	for _, g := range []string{"agentrun_running{}", "agentrun_queued{}"} {
		if v, ok := after[g]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", g, v, ok)
		}
	}
	if _, ok := after["agentrun_pool_ready"+img]; !ok {
		t.Errorf("agentrun_pool_ready%s missing", img)
	}
	for _, g := range []string{"go_goroutines{}", "process_resident_memory_bytes{}", "process_cpu_seconds_total{}"} {
		if _, ok := after[g]; !ok {
			t.Errorf("%s missing: the Go and process collectors", g)
		}
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeReloadsOnSIGHUP: SIGHUP applies a new config to the runs that
// come next (policy, quota, pool size) while a run going on finishes
// untouched; a broken config, or one changing what takes a restart, is
// refused with a log line and the one before stays.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "r.sock")
	cfg := map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": "", "runsc": map[string]any{"path": runscPath, "flags": []string{}},
		"policy": map[string]any{"local_images": []string{*imagesDir}, "memory": "512m"},
		"server": map[string]any{"listen": "unix://" + sock, "pool": map[string]int{pythonImage: 1}}}
	s := startServeWith(t, cfg)
	s.waitPool(pythonImage, 1)

	// A run going on through the reloads.
	long := make(chan *result.Result, 1)
	go func() {
		var res result.Result
		s.post(`{"code": "import time; time.sleep(3); print('survived')", "limits": {"memory": "300m"}}`, &res)
		long <- &res
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var h server.Health
		if s.get("/healthz", &h); h.Running == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the long run never started")
		}
	}

	hup := func(wantLog string) {
		t.Helper()
		n := strings.Count(s.log(), "SIGHUP")
		s.cmd.Process.Signal(syscall.SIGHUP)
		for deadline := time.Now().Add(10 * time.Second); strings.Count(s.log(), "SIGHUP") == n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no log line after SIGHUP: %s", s.log())
			}
		}
		lines := strings.Split(strings.TrimSpace(s.log()), "\n")
		if last := lines[len(lines)-1]; !strings.Contains(last, wantLog) {
			t.Fatalf("after SIGHUP: %q, want %q", last, wantLog)
		}
	}
	write := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(s.config, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	task300 := `{"code": "print(1)", "limits": {"memory": "300m"}, "session": "x"}`

	// Good: a lower memory policy, a quota, two pooled sandboxes.
	cfg["policy"].(map[string]any)["memory"] = "256m"
	cfg["server"].(map[string]any)["pool"] = map[string]int{pythonImage: 2}
	cfg["server"].(map[string]any)["quota"] = map[string]any{"runs_per_minute": 1}
	good, _ := json.Marshal(cfg)
	write(good)
	hup("reloaded")
	var apiErr server.APIError
	if resp := s.post(task300, &apiErr); resp.StatusCode != 403 || apiErr.Field != "limits.memory" {
		t.Errorf("300m after the reload: status %d %+v, want 403 on limits.memory", resp.StatusCode, apiErr)
	}
	s.waitPool(pythonImage, 2)
	var res result.Result
	if resp := s.post(`{"code": "print(1)", "session": "q"}`, &res); resp.StatusCode != 200 {
		t.Fatalf("run after reload: %d", resp.StatusCode)
	}
	if resp := s.post(`{"code": "print(1)", "session": "q"}`, &apiErr); resp.StatusCode != 429 {
		t.Errorf("second run of session q: status %d, want 429 (the new quota)", resp.StatusCode)
	}

	// Broken, and one changing the socket: refused, the good one stays.
	write([]byte(`{"policy": {"memory": "1g"}, "server": {`))
	hup("refused, the old one stays")
	moved := map[string]any{}
	json.Unmarshal(good, &moved)
	moved["server"].(map[string]any)["listen"] = "unix://" + sock + ".other"
	b, _ := json.Marshal(moved)
	write(b)
	hup("server.listen changed, which takes a restart")
	if resp := s.post(task300, &apiErr); resp.StatusCode != 403 {
		t.Errorf("300m after refused reloads: status %d, want 403 still", resp.StatusCode)
	}
	s.waitPool(pythonImage, 2)

	select {
	case r := <-long:
		if r.Stdout != "survived\n" || r.Error != "" {
			t.Errorf("the run going on during the reloads: %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the run going on during the reloads never ended")
	}
	s.stop()
	assertNoLeaks(t)
}

// TestSystemdUnitsVerify: systemd-analyze verify accepts every unit of
// packaging/systemd, with no warning, against a root holding the binary.
func TestSystemdUnitsVerify(t *testing.T) {
	root := t.TempDir()
	units := filepath.Join(testenv.RepoRoot(), "packaging", "systemd")
	for _, c := range [][]string{
		{"mkdir", "-p", root + "/usr/bin", root + "/bin", root + "/lib/systemd", root + "/etc/systemd/system"},
		{"cp", agentrunBin(t), root + "/usr/bin/agentrun"},
		{"cp", "/bin/sh", "/bin/kill", root + "/bin/"},
		// The system's own units (sysinit.target and the rest).
		{"cp", "-a", "/lib/systemd/system", root + "/lib/systemd/"},
		{"sh", "-c", "cp " + units + "/*.socket " + units + "/*.service " + root + "/etc/systemd/system/"},
		{"ln", "-s", "agentrun@.service", root + "/etc/systemd/system/agentrun@hello.service"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	names := []string{"agentrun.socket", "agentrun.service", "agentrun@hello.service", "agentrun-worker.service"}
	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no", "--root=" + root}, names...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v: %s", err, out)
	}
}

// notifySocket listens where NOTIFY_SOCKET points and sends on what
// arrives, one state line each.
func notifySocket(t *testing.T) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	states := make(chan string, 16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			for _, l := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				states <- l
			}
		}
	}()
	return path, states
}

func waitState(t *testing.T, states <-chan string, want string, log func() string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case s := <-states:
			if s == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %s from serve: %s", want, log())
		}
	}
}

// TestServeSocketActivated: serve started by systemd-socket-activate (the
// socket made and passed by systemd's tool, LISTEN_FDS) answers on that
// socket; it says READY=1 on NOTIFY_SOCKET only once its pool is full, and
// STOPPING=1 on SIGTERM; it leaves systemd's socket file in place.
func TestServeSocketActivated(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "activated.sock")
	notify, states := notifySocket(t)
	// server.listen names another path: the passed socket wins.
	cfgPath := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": "-", "policy": map[string]any{"local_images": []string{*imagesDir}},
		"server": map[string]any{"listen": "unix://" + sock + ".unused", "pool": map[string]int{pythonImage: 1}}})
	cmd := exec.Command("systemd-socket-activate", "--listen="+sock, "-E", "NOTIFY_SOCKET="+notify, "-E", "PATH",
		agentrunBin(t), "serve", "--config", cfgPath)
	var mu sync.Mutex
	var stderr strings.Builder
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("systemd-socket-activate (Debian package systemd): %v", err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			mu.Lock()
			stderr.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	log := func() string { mu.Lock(); defer mu.Unlock(); return stderr.String() }
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
			gcCLI(t)
		}
	})
	s := &served{t: t, cmd: cmd, stderr: &strings.Builder{}, mu: &sync.Mutex{}, base: "http://agentrun",
		client: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}}
	// The socket exists before serve does; the first connection starts it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd-socket-activate made no socket: %s", log())
		}
	}
	var h server.Health
	if s.get("/healthz", &h); h.Status != "ok" {
		t.Fatalf("healthz on the passed socket: %+v", h)
	}
	waitState(t, states, "READY=1", log)
	if s.get("/healthz", &h); h.Pool == nil || h.Pool.Ready[pythonImage] != 1 {
		t.Errorf("READY=1 with the pool not full: %+v", h.Pool)
	}
	var res result.Result
	if resp := s.post(`{"code": "print(6*7)"}`, &res); resp.StatusCode != 200 || res.Stdout != "42\n" {
		t.Fatalf("run on the passed socket: %d %+v", resp.StatusCode, res)
	}
	if _, err := os.Stat(sock + ".unused"); err == nil {
		t.Errorf("serve listened on server.listen too")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	waitState(t, states, "STOPPING=1", log)
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("serve: %v: %s", waitErr, log())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop: %s", log())
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("systemd's socket file was removed: %v", err)
	}
	// audit "-": the record is on stderr, which the journal takes.
	if !strings.Contains(log(), `"task_hash"`) {
		t.Errorf("no audit record on stderr: %s", log())
	}
	assertNoLeaks(t)
}
