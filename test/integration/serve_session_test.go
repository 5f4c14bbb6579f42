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
