package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
)

// served is an `agentrun serve` process and an HTTP client for it.
type served struct {
	t      *testing.T
	cmd    *exec.Cmd
	client *http.Client
	base   string // http://host[:port]
	token  string
	stderr *strings.Builder
	mu     *sync.Mutex
}

// startServe starts agentrun serve with the test config plus server, and
// waits until it listens (and its pool, if any, is full).
func startServe(t *testing.T, srv map[string]any) *served {
	t.Helper()
	return startServeCfg(t, srv, map[string]any{"local_images": []string{*imagesDir}})
}

// startServeCfg is startServe with the config's policy.
func startServeCfg(t *testing.T, srv, policy map[string]any) *served {
	t.Helper()
	cfg := map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": "", "server": srv, "runsc": map[string]any{"path": runscPath, "flags": []string{}},
		"policy": policy}
	cmd := exec.Command(agentrunBin(t), "serve", "--config", writeConfig(t, cfg))
	s := &served{t: t, cmd: cmd, stderr: &strings.Builder{}, mu: &sync.Mutex{}}
	if tok, ok := srv["token"].(string); ok {
		s.token = tok
	}
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A test that failed half-way: stop the server as SIGTERM would,
		// and if it does not stop, kill it and let gc remove its pool.
		if cmd.ProcessState != nil {
			return
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
			return
		case <-time.After(20 * time.Second):
		}
		cmd.Process.Kill()
		<-done
		if err := gcCLI(t); err != nil {
			t.Errorf("after killing the server: %v", err)
		}
	})
	addr := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.mu.Lock()
			s.stderr.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if a, ok := strings.CutPrefix(sc.Text(), "agentrun serve: listening on "); ok {
				addr <- a
			}
		}
	}()
	select {
	case a := <-addr:
		if strings.HasPrefix(a, "/") {
			s.base = "http://agentrun"
			s.client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", a)
			}}}
		} else {
			s.base = "http://" + a
			s.client = &http.Client{}
		}
	case <-exited:
		t.Fatalf("agentrun serve exited: %s", s.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("agentrun serve did not start: %s", s.log())
	}
	if pool, ok := srv["pool"].(map[string]int); ok {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var h server.Health
			s.get("/healthz", &h)
			if h.Pool != nil && h.Pool.Ready[pythonImage] == pool[pythonImage] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool not filled: %+v; log: %s", h.Pool, s.log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return s
}

func (s *served) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

func (s *served) do(method, path, body string) (*http.Response, []byte) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp, b
}

func (s *served) get(path string, v any) int {
	s.t.Helper()
	resp, b := s.do("GET", path, "")
	if err := json.Unmarshal(b, v); err != nil {
		s.t.Fatalf("GET %s: %v: %s", path, err, b)
	}
	return resp.StatusCode
}

// post runs a task and decodes the answer into v.
func (s *served) post(task string, v any) *http.Response {
	s.t.Helper()
	resp, b := s.do("POST", "/v1/runs", task)
	if err := json.Unmarshal(b, v); err != nil {
		s.t.Fatalf("POST /v1/runs: status %d: %v: %s", resp.StatusCode, err, b)
	}
	return resp
}

// stop sends SIGTERM and waits for a clean exit.
func (s *served) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			s.t.Fatalf("agentrun serve exited with %v: %s", err, s.log())
		}
	case <-time.After(30 * time.Second):
		s.t.Fatalf("agentrun serve did not stop on SIGTERM: %s", s.log())
	}
}

// TestServeRunsTasksFromThePool: over the unix socket, a task runs in a
// pooled sandbox and its result comes back; bad and refused tasks get 400
// and 403 naming the field; ?stream=1 streams the output as it comes; on
// SIGTERM the server empties its pool, removes its socket and leaves
// nothing on the host.
func TestServeRunsTasksFromThePool(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agentrun.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "pool": map[string]int{pythonImage: 1}})

	st, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v; want 0660", st.Mode().Perm())
	}

	var res result.Result
	if resp := s.post(`{"code": "import sys; print(sys.stdin.read() * 2)", "stdin": "ab"}`, &res); resp.StatusCode != 200 {
		t.Fatalf("status %d: %+v", resp.StatusCode, res)
	}
	if res.Stdout != "abab\n" || res.ExitCode != 0 || res.ID == "" {
		t.Fatalf("result %+v", res)
	}
	var h server.Health
	s.get("/healthz", &h)
	if h.Status != "ok" || h.Pool == nil || h.Pool.Hits != 1 {
		t.Fatalf("healthz %+v (pool %+v); want one pool hit", h, h.Pool)
	}

	var apiErr server.APIError
	if resp := s.post(`{"code": "print(1)", "limits": {"memory": "lots"}}`, &apiErr); resp.StatusCode != 400 || apiErr.Field != "limits.memory" {
		t.Errorf("bad memory: status %d, %+v; want 400 naming limits.memory", resp.StatusCode, apiErr)
	}
	if resp := s.post(`{"code": "print(1)", "limits": {"timeout": "1h"}}`, &apiErr); resp.StatusCode != 403 || apiErr.Field != "limits.timeout" {
		t.Errorf("timeout above policy: status %d, %+v; want 403 naming limits.timeout", resp.StatusCode, apiErr)
	}

	// Streamed, on both runtimes: the first line arrives while the
	// program still runs.
	for _, rt := range runtimes {
		streamRun(t, s, rt)
	}

	s.stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket still there after SIGTERM: %v", err)
	}
	assertNoLeaks(t)
}

// streamRun runs a task that prints, sleeps and prints again with
// ?stream=1 and checks the output came as it was written.
func streamRun(t *testing.T, s *served, rt string) {
	t.Helper()
	resp, err := s.client.Post(s.base+"/v1/runs?stream=1", "application/json",
		strings.NewReader(`{"runtime": "`+rt+`", "code": "import time\nprint('a', flush=True)\ntime.sleep(0.6)\nprint('b')"}`))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(resp.Body)
	var events []server.Event
	var firstAt, resultAt time.Time
	for {
		var ev server.Event
		if err := dec.Decode(&ev); err != nil {
			break
		}
		if len(events) == 0 {
			firstAt = time.Now()
		}
		if ev.Event == "result" {
			resultAt = time.Now()
		}
		events = append(events, ev)
	}
	resp.Body.Close()
	if len(events) == 0 {
		t.Fatalf("%s: no events", rt)
	}
	var streamed strings.Builder
	for _, ev := range events[:len(events)-1] {
		if ev.Event != "stdout" {
			t.Errorf("event %+v; want stdout only before the result", ev)
		}
		streamed.WriteString(ev.Data)
	}
	last := events[len(events)-1]
	if streamed.String() != "a\nb\n" || last.Event != "result" || last.Result == nil || last.Result.Stdout != "a\nb\n" {
		t.Fatalf("%s: streamed events %+v", rt, events)
	}
	if gap := resultAt.Sub(firstAt); gap < 400*time.Millisecond {
		t.Errorf("%s: the first line came only %v before the result: not streamed", rt, gap)
	}
}

// TestServeAdmission: with one run slot and a queue of one, a third
// concurrent run is refused with 503; a session over its quota gets 429
// with Retry-After, and other sessions are not affected.
func TestServeAdmission(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "a.sock"),
		"max_concurrent": 1, "queue": 1, "quota": map[string]any{"runs_per_minute": 3, "concurrent": 2}})

	slow := func(session string) string {
		return fmt.Sprintf(`{"code": "import time; time.sleep(1.5); print('done')", "session": %q}`, session)
	}
	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, 2)
	for _, session := range []string{"a", "b"} {
		go func() {
			resp, b := s.do("POST", "/v1/runs", slow(session))
			answers <- answer{resp.StatusCode, string(b)}
		}()
	}
	// Both taken: one runs, one waits in the queue.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var h server.Health
		s.get("/healthz", &h)
		if h.Running == 1 && h.Queued == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw one running and one queued: %+v", h)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var apiErr server.APIError
	if resp := s.post(slow("c"), &apiErr); resp.StatusCode != 503 || !strings.Contains(apiErr.Error, "busy") {
		t.Errorf("third run: status %d, %+v; want 503 busy", resp.StatusCode, apiErr)
	}
	for range 2 {
		if a := <-answers; a.status != 200 || !strings.Contains(a.body, `"stdout": "done\n"`) {
			t.Errorf("queued runs: status %d: %s", a.status, a.body)
		}
	}

	// Session a has used 1 of its 3 runs per minute.
	var res result.Result
	for range 2 {
		if resp := s.post(`{"code": "print(1)", "session": "a"}`, &res); resp.StatusCode != 200 {
			t.Fatalf("run within quota: status %d", resp.StatusCode)
		}
	}
	resp := s.post(`{"code": "print(1)", "session": "a"}`, &apiErr)
	if resp.StatusCode != 429 || !strings.Contains(apiErr.Error, "3 runs per minute") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("over quota: status %d, %+v, Retry-After %q; want 429 naming the quota", resp.StatusCode, apiErr, resp.Header.Get("Retry-After"))
	}
	if resp := s.post(`{"code": "print(1)", "session": "b"}`, &res); resp.StatusCode != 200 {
		t.Errorf("another session: status %d", resp.StatusCode)
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeTCPNeedsToken: a TCP listener requires server.token, and every
// request must carry it.
func TestServeTCPNeedsToken(t *testing.T) {
	cfg := map[string]any{"image": pythonImage, "state_dir": stateDir, "audit": "",
		"server": map[string]any{"listen": "tcp://127.0.0.1:0"}}
	out, err := exec.Command(agentrunBin(t), "serve", "--config", writeConfig(t, cfg)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "server.token") {
		t.Fatalf("tcp without a token: %v: %s; want a refusal naming server.token", err, out)
	}

	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "s3cret"})
	var res result.Result
	if resp := s.post(`{"code": "print(7)"}`, &res); resp.StatusCode != 200 || res.Stdout != "7\n" {
		t.Fatalf("with the token: status %d, %+v", resp.StatusCode, res)
	}
	s.token = "wrong"
	var apiErr server.APIError
	if resp := s.post(`{"code": "print(7)"}`, &apiErr); resp.StatusCode != 401 {
		t.Errorf("wrong token: status %d; want 401", resp.StatusCode)
	}
	s.token = ""
	if code := s.get("/healthz", &apiErr); code != 401 {
		t.Errorf("no token: status %d; want 401", code)
	}
	s.token = "s3cret"
	s.stop()
	assertNoLeaks(t)
}

// TestServeSIGKILLThenGC: a server killed with its pool full leaves
// prepared sandboxes (their inits waiting to exec) behind; `agentrun gc`
// removes every one of them.
func TestServeSIGKILLThenGC(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "k.sock"),
		"pool": map[string]int{pythonImage: 2}})
	if leaks := hostLeaks(); len(leaks) == 0 {
		t.Fatal("a full pool shows nothing on the host; the leak check cannot see pooled sandboxes")
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()

	if err := gcCLI(t); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t)
}

// TestRunThroughServer: `agentrun run --server` sends the task to agentrun
// serve and behaves like a local run (result, exit status), as a user with
// no privilege but access to the socket; refusals and an unreachable
// server exit 125 with the reason.
func TestRunThroughServer(t *testing.T) {
	// A dir nobody can reach: the socket, and an unprivileged copy of the
	// binary.
	dir := clientDir(t)
	sock := filepath.Join(dir, "agentrun.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "pool": map[string]int{pythonImage: 1}})

	// The socket goes to nobody's group, as it would to the agentrun group.
	bin := copyBin(t, dir)
	if err := os.Chown(sock, 0, 65534); err != nil {
		t.Fatal(err)
	}
	client := func(task string, args ...string) (res result.Result, code int) {
		t.Helper()
		cmd := exec.Command(bin, append(append([]string{"run"}, args...), "-")...)
		cmd.Stdin = strings.NewReader(task)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		cmd.Env = []string{"AGENTRUN_SERVER=unix://" + sock}
		out, err := cmd.Output()
		code = cmd.ProcessState.ExitCode()
		if jerr := json.Unmarshal(out, &res); jerr != nil {
			t.Fatalf("agentrun run %v: %v, %v: %s", args, err, jerr, out)
		}
		return res, code
	}

	res, code := client(`{"code": "import os; print(os.getuid(), 6 * 7)"}`)
	if code != 0 || res.Stdout != "65534 42\n" {
		t.Fatalf("exit %d, result %+v", code, res)
	}
	if res, code = client(`{"code": "import sys; sys.exit(3)"}`); code != 3 || res.ExitCode != 3 {
		t.Errorf("exit %d, exit_code %d; want 3", code, res.ExitCode)
	}
	if res, code = client(`{"code": "print(1)", "limits": {"pids": 100000}}`); code != 125 || !strings.Contains(res.Error, "limits.pids") {
		t.Errorf("over policy: exit %d, error %q; want 125 naming limits.pids", code, res.Error)
	}
	if res, code = client(`{"code": "print(1)"}`, "--server", "unix://"+filepath.Join(dir, "nothing.sock")); code != 125 || !strings.Contains(res.Error, "reaching the server") {
		t.Errorf("no server: exit %d, error %q; want 125", code, res.Error)
	}
	if out, err := exec.Command(bin, "run", "--server", "unix://"+sock, "--config", "/etc/x.json", "-").CombinedOutput(); err == nil || !strings.Contains(string(out), "--config") {
		t.Errorf("--server with --config: %v: %s; want a refusal", err, out)
	}
	var h server.Health
	s.get("/healthz", &h)
	if h.Pool == nil || h.Pool.Hits == 0 {
		t.Errorf("no run through the server came from its pool: %+v", h.Pool)
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeClientGoneAndSIGTERM: a run whose client goes away is killed
// and its sandbox removed while the server goes on; on SIGTERM a run going
// on finishes and is answered before the server exits.
func TestServeClientGoneAndSIGTERM(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "g.sock")})

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/runs",
		strings.NewReader(`{"code": "import time; time.sleep(30)", "limits": {"timeout": "40s"}}`))
	if _, err := s.client.Do(req); err == nil {
		t.Fatal("a 30s run answered within 500ms")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var h server.Health
		s.get("/healthz", &h)
		if h.Running == 0 && len(hostLeaks()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the client left: %+v, host: %v", h, hostLeaks())
		}
		time.Sleep(20 * time.Millisecond)
	}

	answered := make(chan string, 1)
	go func() {
		resp, err := s.client.Post(s.base+"/v1/runs", "application/json",
			strings.NewReader(`{"code": "import time; time.sleep(1); print('finished')"}`))
		if err != nil {
			answered <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- string(b)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var h server.Health
		s.get("/healthz", &h)
		if h.Running == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never started")
		}
	}
	s.stop()
	if b := <-answered; !strings.Contains(b, `"stdout": "finished\n"`) {
		t.Fatalf("the run going on at SIGTERM was answered %s", b)
	}
	assertNoLeaks(t)
}

// TestServePoolsTheDefaultImage: the config's own image is pooled even
// when tasks may not name local images (it is theirs by default).
func TestServePoolsTheDefaultImage(t *testing.T) {
	s := startServeCfg(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "d.sock"),
		"pool": map[string]int{pythonImage: 1}}, map[string]any{})
	var res result.Result
	if resp := s.post(`{"code": "print(1 + 1)"}`, &res); resp.StatusCode != 200 || res.Stdout != "2\n" {
		t.Fatalf("status %d, %+v", resp.StatusCode, res)
	}
	var h server.Health
	s.get("/healthz", &h)
	if h.Pool == nil || h.Pool.Hits != 1 {
		t.Fatalf("pool %+v; want the run served from it", h.Pool)
	}
	s.stop()
	assertNoLeaks(t)
}
