package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/proxy/proxytest"
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
	config string // the config file's path
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
	return startServeWith(t, serveConfig(srv, policy))
}

// serveConfig is the config startServeCfg uses, for tests that add to it.
func serveConfig(srv, policy map[string]any) map[string]any {
	return map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"audit": "", "server": srv, "runsc": map[string]any{"path": runscPath, "flags": []string{}},
		"policy": policy}
}

// startServeWith starts agentrun serve with the config cfg, written to a
// file that the test may change (s.config).
func startServeWith(t *testing.T, cfg map[string]any) *served {
	t.Helper()
	srv, _ := cfg["server"].(map[string]any)
	path := writeConfig(t, cfg)
	cmd := exec.Command(agentrunBin(t), "serve", "--config", path)
	s := &served{t: t, cmd: cmd, stderr: &strings.Builder{}, mu: &sync.Mutex{}, config: path}
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

// do sends a request with the token and reads the answer, which must be
// one the OpenAPI document describes.
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
	checkAnswer(s.t, method, req.URL.Path, resp, b)
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

// newSession makes a session over the API and returns its id.
func (s *served) newSession() string {
	s.t.Helper()
	resp, b := s.do("POST", "/v1/sessions", "")
	var made struct{ ID string }
	if err := json.Unmarshal(b, &made); resp.StatusCode != 201 || err != nil || !strings.HasPrefix(made.ID, "ss-") {
		s.t.Fatalf("POST /v1/sessions: %d %s", resp.StatusCode, b)
	}
	return made.ID
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
	if code != 0 || !sandboxUID42(res.Stdout) {
		t.Fatalf("exit %d, result %+v", code, res)
	}
	if res, code = client(`{"code": "import sys; sys.exit(3)"}`); code != 3 || res.ExitCode != 3 {
		t.Errorf("exit %d, exit_code %d; want 3", code, res.ExitCode)
	}
	// A timeout's exit_code is the exit status, as a local run's is.
	if res, code = client(`{"code": "while True: pass", "limits": {"timeout": "500ms"}}`); code != result.ExitTimeout || res.ExitCode != code || !res.TimedOut {
		t.Errorf("timeout: exit %d, exit_code %d, timed_out %v; want 124 both", code, res.ExitCode, res.TimedOut)
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

// runAsNobody runs bin as uid 65534 in the given groups with env.
func runAsNobody(bin string, env []string, groups []uint32, stdin string, args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: groups}}
	cmd.Env = env
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Run()
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// agentrunGroup returns the gid of the agentrun group, adding the group
// for the test when the host lacks it.
func agentrunGroup(t *testing.T) uint32 {
	t.Helper()
	lookup := func() (uint32, bool) {
		out, err := exec.Command("getent", "group", "agentrun").Output()
		if err != nil {
			return 0, false
		}
		f := strings.Split(strings.TrimSpace(string(out)), ":")
		var gid uint32
		_, err = fmt.Sscan(f[2], &gid)
		return gid, err == nil
	}
	if gid, ok := lookup(); ok {
		return gid
	}
	if out, err := exec.Command("groupadd", "--system", "agentrun").CombinedOutput(); err != nil {
		t.Fatalf("groupadd agentrun: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("groupdel", "agentrun").Run() })
	gid, ok := lookup()
	if !ok {
		t.Fatal("group agentrun not found after groupadd")
	}
	return gid
}

// TestServeSocketReachableByGroup: with the default layout (the socket in
// a dir that also holds the state dir), a user in the agentrun group can
// run tasks through the socket, and still cannot enter the state dir.
func TestServeSocketReachableByGroup(t *testing.T) {
	gid := agentrunGroup(t)
	dir := clientDir(t)
	bin := copyBin(t, dir)
	runDir := filepath.Join(dir, "agentrun") + ".d" // made by serve, as /run/agentrun
	sock := filepath.Join(runDir, "agentrun.sock")
	state := filepath.Join(runDir, "state")
	cfg := serveConfig(map[string]any{"listen": "unix://" + sock}, map[string]any{"local_images": []string{*imagesDir}})
	cfg["state_dir"] = state
	s := startServeWith(t, cfg)

	out, errOut, code := runAsNobody(bin, []string{"AGENTRUN_SERVER=unix://" + sock}, []uint32{gid}, `{"code": "print(6 * 7)"}`, "run", "-")
	if code != 0 || !strings.Contains(out, `"stdout": "42\n"`) {
		t.Fatalf("as nobody in group agentrun: exit %d: %s %s", code, out, errOut)
	}
	st, err := os.Stat(runDir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o750 || st.Sys().(*syscall.Stat_t).Gid != gid {
		t.Errorf("socket dir mode %v gid %d; want 0750 and group agentrun (%d)", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid, gid)
	}
	if out, _, code := runAsNobody("/bin/ls", nil, []uint32{gid}, "", state); code == 0 {
		t.Errorf("a member of group agentrun can list the state dir: %s", out)
	}
	// Not in the group: no access.
	if _, errOut, code := runAsNobody(bin, []string{"AGENTRUN_SERVER=unix://" + sock}, []uint32{}, `{"code": "1"}`, "run", "-"); code != 125 || !strings.Contains(errOut, "permission denied") {
		t.Errorf("outside the group: exit %d: %s; want permission denied", code, errOut)
	}
	s.stop()
	// A socket inside the state dir is refused.
	cfg = serveConfig(map[string]any{"listen": "unix://" + filepath.Join(state, "x.sock")}, map[string]any{})
	cfg["state_dir"] = state
	if out, err := exec.Command(agentrunBin(t), "serve", "--config", writeConfig(t, cfg)).CombinedOutput(); err == nil || !strings.Contains(string(out), "inside state_dir") {
		t.Errorf("socket in the state dir: %v: %s; want a refusal", err, out)
	}
	assertNoLeaks(t)
}

// TestServeOneAtATimeNeverRefused: a client that sends its runs one after
// the other, each once it has the previous answer, is never refused, even
// with a session quota of one concurrent run.
func TestServeOneAtATimeNeverRefused(t *testing.T) {
	dir := clientDir(t)
	bin := copyBin(t, dir)
	sock := filepath.Join(dir, "q.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "quota": map[string]any{"concurrent": 1, "runs_per_minute": 0}})
	// A new connection for each run, as separate clients open: on a kept
	// connection the next request waits for the previous handler anyway.
	s.client.Transport.(*http.Transport).DisableKeepAlives = true
	for i := range 20 {
		var res result.Result
		if resp := s.post(`{"code": "print(1)", "session": "one"}`, &res); resp.StatusCode != 200 {
			t.Fatalf("POST %d: status %d: %+v", i, resp.StatusCode, res)
		}
	}
	for i := range 8 {
		cmd := exec.Command(bin, "run", "--server", "unix://"+sock, "-")
		cmd.Stdin = strings.NewReader(`{"code": "print(2)", "session": "one"}`)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("run --server %d: %v: %s", i, err, out)
		}
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeRetryAfter: run --server waits out a 503 (server busy) as its
// Retry-After says and gets its run.
func TestServeRetryAfter(t *testing.T) {
	dir := clientDir(t)
	bin := copyBin(t, dir)
	sock := filepath.Join(dir, "r.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "max_concurrent": 1, "queue": 0})
	busy := make(chan int, 1)
	go func() {
		resp, _ := s.do("POST", "/v1/runs", `{"code": "import time; time.sleep(2)", "session": "slow"}`)
		busy <- resp.StatusCode
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var h server.Health
		s.get("/healthz", &h)
		if h.Running == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow run never started")
		}
	}
	var apiErr server.APIError
	if resp := s.post(`{"code": "print(1)"}`, &apiErr); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("while busy: status %d; want 503 with Retry-After", resp.StatusCode)
	}
	cmd := exec.Command(bin, "run", "--server", "unix://"+sock, "-")
	cmd.Stdin = strings.NewReader(`{"code": "print('after the wait')"}`)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"stdout": "after the wait\n"`) {
		t.Fatalf("run --server while busy: %v: %s; want it to wait and run", err, out)
	}
	if code := <-busy; code != 200 {
		t.Errorf("the slow run: status %d", code)
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeErrorsAndMissingPoolImage: a pool image that cannot be had does
// not stop the server, which reports it in /healthz and runs other tasks;
// unknown paths and methods get JSON errors.
func TestServeErrorsAndMissingPoolImage(t *testing.T) {
	missing := "dir:" + filepath.Join(*imagesDir, "no-such-image", "rootfs")
	s := startServe(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "e.sock"),
		"pool": map[string]int{missing: 1}})
	var h server.Health
	s.get("/healthz", &h)
	if h.Status != "degraded" || h.Pool == nil || !strings.Contains(h.Pool.Errors[missing], "no-such-image") {
		t.Fatalf("healthz %+v (pool %+v); want degraded naming %s", h, h.Pool, missing)
	}
	var res result.Result
	if resp := s.post(`{"code": "print(3)"}`, &res); resp.StatusCode != 200 || res.Stdout != "3\n" {
		t.Fatalf("a run: status %d, %+v", resp.StatusCode, res)
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{{"GET", "/v1/nothing", 404}, {"GET", "/v1/runs", 405}, {"POST", "/healthz", 405}} {
		resp, b := s.do(tc.method, tc.path, "")
		var e server.APIError
		if resp.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || e.Error == "" {
			t.Errorf("%s %s: status %d: %s; want %d and a JSON error", tc.method, tc.path, resp.StatusCode, b, tc.status)
		}
	}
	s.stop()
	assertNoLeaks(t)
}

// vmHWM is the peak resident memory of process pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestServeBodiesBounded: 20 clients each sending a task of 32 MiB less
// 2 bytes, slowly, do not make the server hold 20 of them: the bodies
// being read or waiting for a run slot are held within serve's body
// budget (256 MiB; past it a body is refused 503 with Retry-After), and
// large tasks are decoded one at a time. A client that sends its headers
// a byte at a time is cut off at the header deadline.
func TestServeBodiesBounded(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "m.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "max_concurrent": 4, "queue": 32})
	// A valid JSON task of 32 MiB - 2 bytes, refused after decoding.
	tail := `", "limits": {"pids": -1}}`
	head := `{"code": "`
	pad := strings.Repeat("a", 32<<20-2-len(head)-len(tail))
	const clients = 20
	var wg sync.WaitGroup
	statuses := make(chan string, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("unix", sock)
			if err != nil {
				statuses <- err.Error()
				return
			}
			defer c.Close()
			body := head + pad + tail
			fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: agentrun\r\nContent-Length: %d\r\n\r\n", len(body))
			// All but the last bytes, a pause, then the rest; a body
			// refused on the way is answered before it is all sent.
			if _, err := io.WriteString(c, body[:len(body)-8]); err == nil {
				time.Sleep(200 * time.Millisecond)
				io.WriteString(c, body[len(body)-8:])
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				statuses <- err.Error()
				return
			}
			resp.Body.Close()
			statuses <- fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Retry-After"))
		}()
	}
	wg.Wait()
	close(statuses)
	ran := 0
	for st := range statuses {
		switch {
		case st == "400 ":
			ran++
		case st == "503 1":
		default:
			t.Errorf("a 32 MiB task: %q; want 400 (limits.pids), or 503 with Retry-After past the body budget", st)
		}
	}
	if ran == 0 {
		t.Error("no 32 MiB task was read and decoded")
	}
	peak := vmHWM(t, s.cmd.Process.Pid)
	t.Logf("server peak RSS after %d clients of 32 MiB: %d MiB; %d read whole", clients, peak>>20, ran)
	if peak > 640<<20 {
		t.Errorf("server peak RSS %d MiB with %d clients sending 32 MiB each; want the bodies bounded by the body budget", peak>>20, clients)
	}

	// Slowloris: the request line, then a header byte a second.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	io.WriteString(c, "POST /v1/runs HTTP/1.1\r\nHost: agentrun\r\n")
	for time.Since(start) < 30*time.Second {
		if _, err := io.WriteString(c, "X"); err != nil {
			break
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 512)); err != nil && !os.IsTimeout(err) {
			break
		}
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("a client sending its headers a byte a second was still connected after %v", d)
	}
	s.stop()
	assertNoLeaks(t)
}

// completeTask touches every result field it can: output past the cap on
// stdout, stderr, a collected file, an allowed and a denied destination,
// and exit 3.
func completeTask(in *proxytest.Internet) string {
	b, _ := json.Marshal(map[string]any{
		"session": "s-complete",
		"code": fetchPy + `
print(fetch("https://internet.test/hello"))
print(fetch("https://evil.example/"))
open("/workspace/out.txt", "w").write("collected")
sys.stderr.write("to stderr\n")
print("x" * 5000)
sys.exit(3)
`,
		"files":   map[string]any{"ca.pem": map[string]string{"content": string(in.CAPEM)}},
		"env":     map[string]string{"SSL_CERT_FILE": "/workspace/ca.pem"},
		"network": map[string]any{"allow": []string{"internet.test"}},
		"collect": []string{"out.txt", "absent.txt"},
		"limits":  map[string]any{"timeout": "20s", "output_bytes": 1000},
	})
	return string(b)
}

// checkComplete checks every field of a result of completeTask, and that
// it agrees with the run's audit record.
func checkComplete(t *testing.T, path string, res *result.Result, auditPath string) {
	t.Helper()
	t.Run(strings.ReplaceAll(path, " ", "_"), func(t *testing.T) { checkCompleteResult(t, path, res, auditPath) })
}

func checkCompleteResult(t *testing.T, path string, res *result.Result, auditPath string) {
	// Each field of the result is checked below, set or (for this run)
	// known to be empty; a field added later must be added here.
	zeroHere := map[string]bool{"signal": true, "timed_out": true, "oom_killed": true, "stderr_truncated": true,
		"stdout_base64": true, "stderr_base64": true, "error": true,
		"image_digest": true} // dir: images have no digest
	set := map[string]bool{}
	hasFile := res.Files["out.txt"].ContentBase64 == "Y29sbGVjdGVk" // "collected"
	allowed, denied := false, false
	for _, a := range res.Network.Allowed {
		allowed = allowed || (a.Host == "internet.test" && a.Port == 443 && a.BytesIn > 0 && a.Conns > 0)
	}
	for _, d := range res.Network.Denied {
		denied = denied || d.Host == "evil.example"
	}
	for k, ok := range map[string]bool{
		"id": res.ID != "", "session": res.Session == "s-complete", "exit_code": res.ExitCode == 3,
		"stdout": strings.HasPrefix(res.Stdout, "200 hello"), "stderr": res.Stderr == "to stderr\n",
		"stdout_truncated": res.StdoutTruncated, "stdout_bytes": res.StdoutBytes > 5000, "stderr_bytes": res.StderrBytes == 10,
		"duration_ms": res.DurationMS > 0, "cpu_ms": res.CPUMS > 0, "memory_peak_bytes": res.MemoryPeakBytes > 0,
		"image": res.Image == pythonImage, "runtime": res.Runtime == "libcontainer",
		"network": allowed && denied && !res.Network.None && res.Network.Note == "", "files": hasFile,
		"collect": res.Collect != nil && slices.Equal(res.Collect.Unmatched, []string{"absent.txt"}) && res.Collect.Cut == "",
	} {
		set[k] = true
		if !ok {
			t.Errorf("%s: result field %q is wrong or empty", path, k)
		}
	}
	for k, zero := range map[string]bool{"signal": res.Signal == "", "timed_out": !res.TimedOut, "oom_killed": !res.OOMKilled,
		"stderr_truncated": !res.StderrTruncated, "stdout_base64": res.StdoutBase64 == "", "stderr_base64": res.StderrBase64 == "",
		"error": res.Error == "", "image_digest": res.ImageDigest == ""} {
		if !zero {
			t.Errorf("%s: result field %q is set; want it empty for this run", path, k)
		}
	}
	b, _ := json.Marshal(res)
	var fields map[string]any
	json.Unmarshal(b, &fields)
	for k := range fields {
		if !set[k] && !zeroHere[k] {
			t.Errorf("result field %q is not checked by this test", k)
		}
	}
	if t.Failed() {
		t.Logf("%s: result %s", path, b)
	}
	// The audit record of the same run says the same. It is written after
	// the tear-down, which may end after the answer.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		f, _ := os.ReadFile(auditPath)
		for _, line := range strings.Split(strings.TrimSpace(string(f)), "\n") {
			var rec audit.Record
			if json.Unmarshal([]byte(line), &rec) != nil || rec.ID != res.ID {
				continue
			}
			if len(rec.Network.Allowed) != len(res.Network.Allowed) || len(rec.Network.Denied) != len(res.Network.Denied) ||
				rec.ExitCode != res.ExitCode || rec.StdoutBytes != res.StdoutBytes || len(rec.Files) != len(res.Files) {
				t.Errorf("%s: the audit record %+v differs from the result", path, rec)
			}
			return
		}
	}
	t.Errorf("%s: no audit record for %s", path, res.ID)
}

// TestServedResultsComplete: a run's result is the same, every field
// filled, over POST /v1/runs, ?stream=1, run --server and a local run,
// even though the server answers before the sandbox is torn down: the
// network decisions in particular, which the audit record also lists.
func TestServedResultsComplete(t *testing.T) {
	in := proxytest.NewInternet(t)
	dir := clientDir(t)
	bin := copyBin(t, dir)
	sock := filepath.Join(dir, "c.sock")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := serveConfig(map[string]any{"listen": "unix://" + sock}, map[string]any{"local_images": []string{*imagesDir}})
	cfg["audit"] = auditPath
	cfg["network"] = map[string]any{"hosts": map[string]string{"internet.test": in.IP.String()}, "allow_ranges": []string{"198.18.0.0/15"}}
	s := startServeWith(t, cfg)
	task := completeTask(in)

	var res result.Result
	s.post(task, &res)
	checkComplete(t, "POST /v1/runs", &res, auditPath)

	resp, b := s.do("POST", "/v1/runs?stream=1", task)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var last server.Event
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Result == nil {
		t.Fatalf("stream: status %d, last line %q", resp.StatusCode, lines[len(lines)-1])
	}
	checkComplete(t, "stream", last.Result, auditPath)

	for name, args := range map[string][]string{
		"run --server": {"run", "--server", "unix://" + sock, "-"},
		"run":          {"run", "--config", writeConfig(t, cfg), "-"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Stdin = strings.NewReader(task)
		out, _ := cmd.Output()
		var r result.Result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%s: %v: %s", name, err, out)
		}
		checkComplete(t, name, &r, auditPath)
	}

	// --format text lists the denial and the file, on stderr.
	cmd := exec.Command(bin, "run", "--server", "unix://"+sock, "--format", "text", "-")
	cmd.Stdin = strings.NewReader(task)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.Run()
	if !strings.Contains(e.String(), "network denied evil.example:443") || !strings.Contains(e.String(), "file out.txt: 9 bytes") ||
		!strings.Contains(o.String(), "stdout truncated") {
		t.Errorf("--format text: stdout %q stderr %q; want the truncation, the file and the denial", o.String(), e.String())
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeStreamUTF8: a character cut across two writes of the program
// comes whole in the stream; bytes that are not UTF-8 come exactly in
// stdout_base64 and data_base64.
func TestServeStreamUTF8(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "u.sock")})
	text := strings.Repeat("日本語", 50)
	code := `import sys, time
b = ("日本語" * 50).encode()
for i in range(0, len(b), 7):
    sys.stdout.buffer.write(b[i:i+7]); sys.stdout.buffer.flush(); time.sleep(0.002)
sys.stdout.buffer.write(b"\xff\n"); sys.stdout.buffer.flush()
`
	body, _ := json.Marshal(map[string]any{"code": code})
	_, b := s.do("POST", "/v1/runs?stream=1", string(body))
	var streamed []byte
	var events int
	var res *result.Result
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev server.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		switch {
		case ev.Event == "result":
			res = ev.Result
		case ev.DataBase64 != "":
			raw, _ := base64.StdEncoding.DecodeString(ev.DataBase64)
			streamed = append(streamed, raw...)
		default:
			streamed = append(streamed, ev.Data...)
		}
		events++
	}
	if string(streamed) != text+"\xff\n" {
		t.Errorf("streamed output %q; want every character whole and the bad byte exact", streamed)
	}
	if n := strings.Count(string(streamed), "\ufffd"); n > 0 {
		t.Errorf("%d replacement characters in the stream", n)
	}
	if res == nil || res.StdoutBase64 == "" || string(res.RawStdout()) != text+"\xff\n" {
		t.Errorf("result %+v; want stdout_base64 with the exact bytes", res)
	}
	t.Logf("%d events", events)
	s.stop()
	assertNoLeaks(t)
}
