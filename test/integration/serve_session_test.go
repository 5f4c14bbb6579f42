package integration

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/session"
)

// TestServeSessions: POST /v1/sessions makes a session; files put over the
// API are read by a run and files a run wrote are listed and read over the
// API; a second run while one runs gets 409, streamed or not; DELETE removes it (409 while
// busy); an unknown id is 404; the token is required throughout.
func TestServeSessions(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "s3cret", "max_concurrent": 4,
		"quota": map[string]any{"concurrent": 0, "runs_per_minute": 0}})
	id := s.newSession()
	base := "/v1/sessions/" + id

	if resp, b := s.do("PUT", base+"/files/in/data.txt", "uploaded"); resp.StatusCode != 204 {
		t.Fatalf("PUT file: %d %s", resp.StatusCode, b)
	}
	task := func(code string) string {
		m := map[string]any{"session": id, "keep_workspace": true, "code": code}
		j, _ := json.Marshal(m)
		return string(j)
	}
	var res result.Result
	if resp := s.post(task(`print(open("in/data.txt").read()); open("out\nname", "w").write("from the run")`), &res); resp.StatusCode != 200 || res.Stdout != "uploaded\n" {
		t.Fatalf("run: %d %+v", resp.StatusCode, res)
	}
	var info server.SessionInfo
	if code := s.get(base, &info); code != 200 || info.ID != id {
		t.Fatalf("GET session: %d %+v", code, info)
	}
	names := map[string]string{}
	for _, f := range info.Files {
		names[f.Name] = f.Type
	}
	if names["out\nname"] != "file" || names["in/data.txt"] != "file" || names["in"] != "dir" {
		t.Errorf("listing: %v", names)
	}
	if resp, b := s.do("GET", base+"/files/"+url.PathEscape("out\nname"), ""); resp.StatusCode != 200 || string(b) != "from the run" {
		t.Errorf("GET file: %d %q", resp.StatusCode, b)
	}
	if resp, _ := s.do("GET", base+"/files/missing", ""); resp.StatusCode != 400 {
		t.Errorf("GET of a missing file: %d", resp.StatusCode)
	}

	// Busy: one run sleeps while another is sent.
	var wg sync.WaitGroup
	wg.Add(1)
	var first result.Result
	go func() {
		defer wg.Done()
		s.post(task(`import time; time.sleep(3)`), &first)
	}()
	waitSessionBusy(t, id)
	var second result.Result
	if resp := s.post(task(`print(1)`), &second); resp.StatusCode != 409 || !strings.Contains(second.Error, "session busy") {
		t.Errorf("second run: %d %+v", resp.StatusCode, second)
	}
	// A streamed run is refused before its stream starts.
	if resp, b := s.do("POST", "/v1/runs?stream=1", task(`print(1)`)); resp.StatusCode != 409 || !strings.Contains(string(b), "session busy") {
		t.Errorf("second run, streamed: %d %s", resp.StatusCode, b)
	}
	if resp, _ := s.do("DELETE", base, ""); resp.StatusCode != 409 {
		t.Errorf("DELETE while busy: %d", resp.StatusCode)
	}
	wg.Wait()
	if first.Error != "" {
		t.Errorf("first run: %+v", first)
	}

	s.token = "wrong"
	if resp, _ := s.do("GET", base, ""); resp.StatusCode != 401 {
		t.Errorf("wrong token: %d", resp.StatusCode)
	}
	s.token = "s3cret"
	if resp, b := s.do("DELETE", base, ""); resp.StatusCode != 204 {
		t.Errorf("DELETE: %d %s", resp.StatusCode, b)
	}
	if resp, _ := s.do("GET", base, ""); resp.StatusCode != 404 {
		t.Errorf("GET after DELETE: %d", resp.StatusCode)
	}
	if resp := s.post(task(`print(1)`), &second); resp.StatusCode != 404 {
		t.Errorf("run in a deleted session: %d %+v", resp.StatusCode, second)
	}
	s.stop()
	assertNoLeaks(t)
}

// waitSessionBusy waits until the session's lock is held; asking does not
// take it.
func waitSessionBusy(t *testing.T, id string) {
	t.Helper()
	cfg := testConfig(t)
	st, err := session.Open(cfg, 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if in, err := st.Get(id); err == nil && in.Busy {
			return
		}
	}
	t.Fatal("session never became busy")
}

// TestServeSessionBackToBack: a client's next call of a session, sent as
// soon as the last one answered, is run, never refused as busy: the run
// before it is still tearing down (its container killed, its disk
// unmounted) and the next one waits for that.
func TestServeSessionBackToBack(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "s3cret", "max_concurrent": 4,
		"quota": map[string]any{"concurrent": 0, "runs_per_minute": 0}})
	id := s.newSession()
	j, _ := json.Marshal(map[string]any{"session": id, "keep_state": true,
		"code": "n = globals().get('n', 0) + 1\nprint(n)"})
	for i := 0; i < 8; i++ {
		want := fmt.Sprintf("%d\n", i+1)
		if i%2 == 1 {
			var res *result.Result
			s.streamEvents(string(j), func(ev server.Event) {
				if ev.Event == "result" {
					res = ev.Result
				}
			})
			if res == nil || res.Error != "" || res.Stdout != want {
				t.Fatalf("call %d of the session, streamed, sent once the one before answered: result %+v; want stdout %q", i+1, res, want)
			}
			continue
		}
		var res result.Result
		if resp := s.post(string(j), &res); resp.StatusCode != 200 || res.Stdout != want {
			t.Fatalf("call %d of the session, sent once the one before answered: %d %+v; want 200 and stdout %q", i+1, resp.StatusCode, res, want)
		}
	}
	s.stop()
	assertNoLeaks(t)
}

// TestServeSessionErrorsNameNoHostPath: what serve answers to requests
// that fail in a session, or in a plain run's workspace, names the files
// as the client named them and never a host path (state_dir or
// store_dir): a task's files that do not fit in the session's disk or in
// the workspace are refused as too large (413), naming the file and the
// bound; a file where the session has a directory, a directory where it
// has a file, file accesses of the wrong kind, and a state a program
// forged say why in the session's terms. A session's created time does
// not move with the writes of its runs.
func TestServeSessionErrorsNameNoHostPath(t *testing.T) {
	cfg := serveConfig(map[string]any{"listen": "tcp://127.0.0.1:0", "token": "s3cret", "max_concurrent": 2,
		"quota": map[string]any{"concurrent": 0, "runs_per_minute": 0}}, map[string]any{"local_images": []string{*imagesDir}})
	cfg["sessions"] = map[string]any{"max_bytes": "16m", "state_max_bytes": "1m"}
	s := startServeWith(t, cfg)
	id := s.newSession()
	base := "/v1/sessions/" + id
	var before server.SessionInfo
	if code := s.get(base, &before); code != 200 {
		t.Fatalf("GET session: %d", code)
	}
	noHostPath := func(what string, b []byte) {
		t.Helper()
		if strings.Contains(string(b), stateDir) {
			t.Errorf("%s: the answer names a host path (%s): %s", what, stateDir, b)
		}
	}
	run := func(what string, m map[string]any, status int, want ...string) *result.Result {
		t.Helper()
		j, _ := json.Marshal(m)
		resp, b := s.do("POST", "/v1/runs", string(j))
		noHostPath(what, b)
		var res result.Result
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("%s: %d %v: %s", what, resp.StatusCode, err, b)
		}
		t.Logf("%s: %d %q", what, resp.StatusCode, res.Error)
		if resp.StatusCode != status {
			t.Errorf("%s: status %d, error %q; want %d", what, resp.StatusCode, res.Error, status)
		}
		for _, w := range want {
			if !strings.Contains(res.Error, w) {
				t.Errorf("%s: error %q; want it to say %q", what, res.Error, w)
			}
		}
		return &res
	}
	inSession := func(code string, extra map[string]any) map[string]any {
		m := map[string]any{"session": id, "keep_workspace": true, "code": code}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	file := func(content string) map[string]string { return map[string]string{"content": content} }

	run("files past the session's disk", inSession("print(1)", map[string]any{"files": map[string]any{
		"big.bin": file(strings.Repeat("x", 20<<20))}}), 413, `"big.bin"`, "sessions.max_bytes", "16777216")
	small := map[string]any{}
	for i := range 20 {
		small[fmt.Sprintf("f%02d", i)] = file(strings.Repeat("y", 3000))
	}
	run("files past a plain run's workspace", map[string]any{"code": "print(1)", "files": small,
		"limits": map[string]any{"workspace_size": "64k"}}, 413, "limits.workspace_size", "65536")

	if resp, b := s.do("PUT", base+"/files/d", "a file"); resp.StatusCode != 204 {
		t.Fatalf("PUT d: %d %s", resp.StatusCode, b)
	}
	if resp, b := s.do("PUT", base+"/files/dir/inner", "in a directory"); resp.StatusCode != 204 {
		t.Fatalf("PUT dir/inner: %d %s", resp.StatusCode, b)
	}
	run("a file under a file of the session", inSession("print(1)", map[string]any{"files": map[string]any{"d/x": file("x")}}), 500)
	run("a file over a directory of the session", inSession("print(1)", map[string]any{"files": map[string]any{"dir": file("x")}}), 500)
	for _, req := range []struct{ method, path, body string }{
		{"GET", base + "/files/dir", ""},
		{"GET", base + "/files/missing", ""},
		{"GET", base + "/files/d/x", ""},
		{"PUT", base + "/files/dir", "x"},
		{"PUT", base + "/files/d/x", "x"},
	} {
		resp, b := s.do(req.method, req.path, req.body)
		noHostPath(req.method+" "+req.path, b)
		if resp.StatusCode < 400 {
			t.Errorf("%s %s: %d", req.method, req.path, resp.StatusCode)
		}
	}

	// The state's directory taken by a file of the client's, then by a
	// link of the program's: the host's copy of the state goes in all
	// the same.
	if resp, b := s.do("PUT", base+"/files/.agentrun", "not a directory"); resp.StatusCode != 204 {
		t.Fatalf("PUT .agentrun: %d %s", resp.StatusCode, b)
	}
	res := run("a state over a file", inSession("n = 1", map[string]any{"keep_state": true}), 200)
	if res.State == nil || !res.State.Saved {
		t.Errorf("a state over a file: %+v", res.State)
	}
	run("a link for the state's directory", inSession(`import os, shutil
shutil.rmtree("/workspace/.agentrun")
os.symlink("/etc", "/workspace/.agentrun")`, nil), 200)
	if res := run("a state over a link", inSession("print(n)", map[string]any{"keep_state": true}), 200); res.Stdout != "1\n" {
		t.Errorf("a state over a link: stdout %q, stderr %q", res.Stdout, res.Stderr)
	}
	res = run("a forged state", inSession(forgeState(4, true), map[string]any{"keep_state": true}), 200)
	if res.State == nil || res.State.Saved || !strings.Contains(res.State.Reason, "state_max_bytes") {
		t.Errorf("a forged state: %+v", res.State)
	}

	var after server.SessionInfo
	if code := s.get(base, &after); code != 200 {
		t.Fatalf("GET session: %d", code)
	}
	if !after.Created.Equal(before.Created) {
		t.Errorf("created moved with the session's runs: %v, then %v", before.Created, after.Created)
	}
	s.stop()
	assertNoLeaks(t)
}
