package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/server/openapitest"
	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// apiDoc is serve's OpenAPI document, which every answer served.do gets
// is checked against.
var apiDoc = sync.OnceValues(openapitest.Load)

// checkAnswer fails t when the answer to method on path is not one the
// OpenAPI document describes.
func checkAnswer(t testing.TB, method, path string, resp *http.Response, body []byte) {
	t.Helper()
	d, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Check(method, path, resp.StatusCode, resp.Header, body); err != nil {
		t.Errorf("answer not as the OpenAPI document says: %v", err)
	}
}

// request sends method path with the token and the headers hdr, and
// returns the answer, checked against the OpenAPI document. With headOnly
// it reads no body (an endless event stream), and closes it.
func (s *served) request(method, path string, body io.Reader, hdr map[string]string, headOnly bool) (*http.Response, []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, body)
	if err != nil {
		s.t.Fatal(err)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var b []byte
	if !headOnly {
		if b, err = io.ReadAll(resp.Body); err != nil {
			s.t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	checkAnswer(s.t, method, req.URL.Path, resp, b)
	return resp, b
}

// streamEvents posts task with ?stream=1 and the token, calls on with
// each event as it comes, and checks the whole answer against the
// document.
func (s *served) streamEvents(task string, on func(server.Event)) {
	s.t.Helper()
	req, err := http.NewRequest("POST", s.base+"/v1/runs?stream=1", strings.NewReader(task))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var all bytes.Buffer
	sc := bufio.NewScanner(io.TeeReader(resp.Body, &all))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev server.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			s.t.Fatalf("stream line %q: %v", sc.Text(), err)
		}
		on(ev)
	}
	checkAnswer(s.t, "POST", "/v1/runs", resp, all.Bytes())
}

// TestServeOpenAPI sends every endpoint of a real serve each answer it
// can give in a test, success and each kind of refusal, and checks each
// against the OpenAPI document it serves (served.do checks those of the
// other serve tests too); every operation the document declares, and
// every status of each, must have been seen, but for those listed with
// why they cannot be made here.
// crossSite are the headers of a browser's request from another site.
var crossSite = map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://elsewhere.example",
	"Content-Type": "application/x-www-form-urlencoded"}

func TestServeOpenAPI(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, _ := serviceServeConfig(t, in, "20s")
	cfg["server"] = map[string]any{"listen": "tcp://127.0.0.1:0", "token": "0pen-api", "max_concurrent": 2, "queue": 0,
		"quota": map[string]any{"runs_per_minute": 2, "concurrent": 0}, "approvals": map[string]any{"page": true}}
	cfg["policy"] = map[string]any{"local_images": []string{*imagesDir}, "registries": []string{"127.0.0.1:1"}}
	cfg["sessions"] = map[string]any{"max": 2, "max_bytes": "16m"}
	cfg["sandboxes"] = map[string]any{"max": 1}
	s := startServeWith(t, cfg)
	doc, err := apiDoc()
	if err != nil {
		t.Fatal(err)
	}
	// Each run names its own session, apart from the quota's test: 2
	// runs a minute each.
	task := func(session string, fields map[string]any) string {
		m := map[string]any{"code": "print(1)", "session": session}
		for k, v := range fields {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	expect := func(method, path, body string, want int) []byte {
		t.Helper()
		resp, b := s.request(method, path, strings.NewReader(body), nil, false)
		// A run's slot is given back once its sandbox is torn down, after
		// its answer: on a slow host the last runs may still hold both.
		for i := 0; i < 100 && resp.StatusCode == http.StatusServiceUnavailable && want != http.StatusServiceUnavailable &&
			bytes.Contains(b, []byte("server busy")); i++ {
			time.Sleep(100 * time.Millisecond)
			resp, b = s.request(method, path, strings.NewReader(body), nil, false)
		}
		if resp.StatusCode != want {
			t.Errorf("%s %s %.100s: %d %.300s; want %d", method, path, body, resp.StatusCode, b, want)
		}
		return b
	}

	// The document, health and metrics; without the token, 401.
	served := expect("GET", "/v1/openapi.json", "", 200)
	if !bytes.Equal(served, server.OpenAPI) {
		t.Error("GET /v1/openapi.json is not the document")
	}
	outsideValidator(t, served)
	expect("GET", "/healthz", "", 200)
	expect("HEAD", "/healthz", "", 200)
	expect("GET", "/metrics", "", 200)
	expect("HEAD", "/metrics", "", 200)
	s.token = ""
	for _, op := range doc.Operations() {
		method, path, _ := strings.Cut(op, " ")
		if strings.HasPrefix(path, "/ui/") {
			continue // the page's own login: pageAnswers
		}
		path = strings.NewReplacer("{run}", "ar-1", "{id}", "x", "{path}", "a.txt", "{pid}", "1", "{port}", "8000").Replace(path)
		expect(method, path, "", 401)
	}
	s.token = "0pen-api"
	// A name that is not this server's, as Host (a rebound name, or a
	// reverse proxy passing it on) or as Origin, on every path, the page's
	// included, with the token: 421 and 403.
	for _, op := range doc.Operations() {
		method, path, _ := strings.Cut(op, " ")
		path = strings.NewReplacer("{run}", "ar-1", "{id}", "x", "{path}", "a.txt", "{pid}", "1", "{port}", "8000").Replace(path)
		for _, c := range []struct {
			hdr  map[string]string
			want int
		}{
			{map[string]string{"Host": "rebound.example", "Origin": "http://rebound.example"}, 421},
			{map[string]string{"Origin": "http://rebound.example"}, 403},
		} {
			if resp, b := s.request(method, path, nil, c.hdr, method == "HEAD"); resp.StatusCode != c.want {
				t.Errorf("%s %s with %v: %d %.200s; want %d", method, path, c.hdr, resp.StatusCode, b, c.want)
			}
		}
	}
	expect("GET", "/v1/nothing", "", 404)
	expect("DELETE", "/v1/runs", "", 405)

	// Runs: the result, streamed and not; each refusal.
	expect("POST", "/v1/runs", task("ok", nil), 200)
	var events []string
	s.streamEvents(task("stream", map[string]any{"code": "import sys; print('out'); print('err', file=sys.stderr)"}), func(ev server.Event) {
		events = append(events, ev.Event)
	})
	if !slices.Contains(events, "stdout") || !slices.Contains(events, "stderr") || events[len(events)-1] != "result" {
		t.Errorf("streamed events %v", events)
	}
	expect("POST", "/v1/runs", task("e500", map[string]any{"code": nil, "command": []string{"/no/such/program"}}), 500)
	expect("POST", "/v1/runs", task("", map[string]any{"limits": map[string]any{"memory": "lots"}}), 400)
	expect("POST", "/v1/runs?stream=2", task("", nil), 400)
	expect("POST", "/v1/runs", task("", map[string]any{"limits": map[string]any{"timeout": "1h"}}), 403)
	expect("POST", "/v1/runs", task("e403", map[string]any{"image": "registry.example/x:1"}), 403)
	expect("POST", "/v1/runs", task("e422", map[string]any{"image": "dir:" + filepath.Join(*imagesDir, "no-such", "rootfs")}), 422)
	expect("POST", "/v1/runs", task("e502", map[string]any{"image": "127.0.0.1:1/x:1"}), 502)
	expect("POST", "/v1/runs", task("ss-00000000000000000000000000000000", map[string]any{"keep_workspace": true}), 404)
	for i, want := range []int{200, 200, 429} {
		resp, b := s.request("POST", "/v1/runs", strings.NewReader(task("quota", nil)), nil, false)
		if resp.StatusCode != want {
			t.Errorf("quota run %d: %d %s; want %d", i, resp.StatusCode, b, want)
		}
	}
	tooBig(t, s, doc)

	// Sessions: two may exist; the third is refused.
	var ids []string
	for range 2 {
		var made struct{ ID string }
		json.Unmarshal(expect("POST", "/v1/sessions", "", 201), &made)
		ids = append(ids, made.ID)
	}
	expect("POST", "/v1/sessions", "", 507)
	sess := "/v1/sessions/" + ids[0]
	expect("PUT", sess+"/files/in/a.txt", "hello", 204)
	if b := expect("GET", sess+"/files/in/a.txt", "", 200); string(b) != "hello" {
		t.Errorf("read back %q", b)
	}
	expect("GET", sess, "", 200)
	expect("GET", sess+"/files/missing.txt", "", 400)
	expect("PUT", sess+"/files/a%00b", "x", 400)
	expect("PUT", sess+"/files/big", strings.Repeat("x", 16<<20+1), 413)
	nobody := "/v1/sessions/ss-00000000000000000000000000000000"
	expect("GET", nobody, "", 404)
	expect("DELETE", nobody, "", 404)
	expect("GET", nobody+"/files/a.txt", "", 404)
	expect("PUT", nobody+"/files/a.txt", "x", 404)
	expect("POST", nobody+"/fork", `{"count": 1}`, 404)
	expect("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "session": "ss-00000000000000000000000000000000"}`, 404)
	expect("POST", sess+"/fork", `{"count": 0}`, 400)
	expect("POST", sess+"/fork", `{"count": 1}`, 507) // sessions.max is 2

	sandboxAnswers(t, s, expect)

	// Busy: a run holds the session; a second run, the listing, the files
	// and DELETE are refused; with a second slow run both run slots are
	// taken and the next run is refused until they end.
	var wg sync.WaitGroup
	slow := func(session string, keep bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, b := s.request("POST", "/v1/runs", strings.NewReader(task(session, map[string]any{"code": "import time; time.sleep(4)", "keep_workspace": keep})), nil, false)
			if resp.StatusCode != 200 {
				t.Errorf("slow run: %d %s", resp.StatusCode, b)
			}
		}()
	}
	slow(ids[0], true)
	waitSessionBusy(t, ids[0])
	expect("POST", "/v1/runs", task(ids[0], map[string]any{"keep_workspace": true}), 409)
	expect("GET", sess, "", 409)
	expect("GET", sess+"/files/in/a.txt", "", 409)
	expect("PUT", sess+"/files/in/a.txt", "x", 409)
	expect("DELETE", sess, "", 409)
	expect("POST", sess+"/fork", `{"count": 1}`, 409)
	expect("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "session": "`+ids[0]+`"}`, 409)
	slow("busy", false)
	waitServeRunning(t, s, 2)
	if resp, _ := s.request("POST", "/v1/runs", strings.NewReader(task("refused", nil)), nil, false); resp.StatusCode != 503 {
		t.Errorf("with both run slots taken: %d; want 503", resp.StatusCode)
	}
	wg.Wait()
	expect("DELETE", sess, "", 204)
	var forked server.ForkAnswer
	if err := json.Unmarshal(expect("POST", "/v1/sessions/"+ids[1]+"/fork", `{"count": 1}`, 201), &forked); err != nil {
		t.Error(err)
	} else if len(forked.Sessions) != 1 || forked.Sessions[0].ID == ids[1] {
		t.Errorf("fork made %+v", forked)
	} else {
		expect("GET", "/v1/sessions/"+forked.Sessions[0].ID, "", 200)
	}

	// Approvals: a held request is approved through the API; a second
	// answer finds nothing waiting; a bad body is refused.
	// The first request held is decided through the API, the second
	// through the approvals page.
	approvalTask := task("approve", map[string]any{"code": postPy + `print(post("/api/write/1", "body")); print(post("/api/write/2", "body"))`,
		"network": map[string]any{"services": []string{"api"}}, "limits": map[string]any{"timeout": "30s"}})
	decided := 0
	s.streamEvents(approvalTask, func(ev server.Event) {
		if ev.Event != "approval" {
			return
		}
		decided++
		if decided == 1 {
			path := fmt.Sprintf("/v1/runs/%s/approvals/%s", ev.Run, ev.Approval.ID)
			expect("POST", path, `{"approve": "yes"}`, 400)
			if resp, b := s.request("POST", path, strings.NewReader(`{"approve": true}`), crossSite, false); resp.StatusCode != 403 {
				t.Errorf("cross-site decision: %d %.200s; want 403", resp.StatusCode, b)
			}
			expect("POST", path, `{"approve": true, "by": "openapi test"}`, 200)
			expect("POST", path, `{"approve": false}`, 404)
			return
		}
		pageAnswers(t, s, ev)
	})
	if decided != 2 {
		t.Errorf("%d approval events; want 2", decided)
	}

	if resp, b := s.request("POST", "/ui/login", strings.NewReader("token=0pen-api"), crossSite, false); resp.StatusCode != 403 {
		t.Errorf("cross-site login: %d %.200s; want 403", resp.StatusCode, b)
	}
	// Every path that changes anything refuses a browser's cross-site
	// request, token or not.
	for _, op := range [][2]string{{"POST", "/v1/runs"}, {"POST", "/v1/sessions"}, {"DELETE", "/v1/sessions/s-none"},
		{"PUT", "/v1/sessions/s-none/files/a"}, {"POST", "/v1/sessions/s-none/fork"}, {"POST", "/mcp"}, {"DELETE", "/mcp"}} {
		if resp, b := s.request(op[0], op[1], strings.NewReader(`{"code": "print(1)"}`), crossSite, false); resp.StatusCode != 403 {
			t.Errorf("cross-site %s %s: %d %.200s; want 403", op[0], op[1], resp.StatusCode, b)
		}
	}

	mcpAnswers(t, s)
	guessAnswers(t, s, doc) // last: this address cannot use the token after

	// Every operation and status, but for those that cannot be made here.
	unreached := map[string]string{
		"POST /v1/runs 408":                                 "the body deadline is 30 s",
		"POST /v1/sessions 404":                             "serve always has sessions",
		"POST /v1/sessions 500":                             "a host failure",
		"GET /v1/sessions/{id} 500":                         "a host failure",
		"DELETE /v1/sessions/{id} 500":                      "a host failure",
		"POST /v1/sessions/{id}/fork 500":                   "a host failure",
		"GET /v1/sessions/{id}/files/{path} 413":            "a 16 MiB file in a session takes a run to write",
		"GET /v1/sessions/{id}/files/{path} 500":            "a host failure",
		"PUT /v1/sessions/{id}/files/{path} 500":            "a host failure",
		"POST /v1/sandboxes 500":                            "a host failure",
		"DELETE /v1/sandboxes/{id} 500":                     "a host failure",
		"POST /v1/sandboxes/{id}/processes 500":             "a host failure",
		"POST /v1/sandboxes/{id}/processes/{pid}/stdin 408": "a process that does not read its stdin for 10 s",
		"GET /v1/sandboxes/{id}/files/{path} 500":           "a host failure",
		"PUT /v1/sandboxes/{id}/files/{path} 500":           "a host failure",
		"DELETE /v1/sandboxes/{id}/files/{path} 500":        "a host failure",
		"POST /v1/sandboxes/{id}/ports/{port}/{path} 200":   "busybox's httpd answers a POST 501 (TestServeSandboxPorts posts)",
		"GET /v1/sandboxes/{id}/ports/{port}/{path} 503":    "64 connections to a sandbox's ports at once",
		"POST /v1/sandboxes/{id}/ports/{port}/{path} 503":   "64 connections to a sandbox's ports at once",
		"GET /mcp 200":                                      "checked without its endless body by mcpAnswers",
		"GET /ui/approvals 404":                             "the page is on here; off, every /ui/ path is 404 (internal/server's tests)",
		"HEAD /ui/approvals 404":                            "the page is on here",
		"GET /ui/approvals.json 404":                        "the page is on here",
		"GET /ui/approvals.js 404":                          "the page is on here",
		"HEAD /ui/approvals.js 404":                         "the page is on here",
		"GET /ui/approvals.css 404":                         "the page is on here",
		"HEAD /ui/approvals.css 404":                        "the page is on here",
		"POST /ui/login 404":                                "the page is on here",
		"GET /mcp 405":                                      "the SDK's GET of a stateless server",
		"GET /mcp 406":                                      "the SDK's refusal of an Accept header",
		"POST /mcp 406":                                     "the SDK's refusal of an Accept header",
	}
	for _, op := range doc.Operations() {
		if !doc.Seen(op, "") {
			t.Errorf("%s: no answer checked", op)
		}
		for _, r := range doc.Responses(op) {
			method, rest, _ := strings.Cut(r, " ")
			tmpl, status, _ := strings.Cut(rest, " ")
			if _, ok := unreached[r]; ok {
				continue
			}
			if !doc.Seen(method+" "+tmpl, status) {
				t.Errorf("%s: not seen", r)
			}
		}
	}
	s.stop()
	assertNoLeaks(t)
}

// guessAnswers gets the token wrong from this address until it is
// throttled, then sends a wrong token to every operation that may answer
// 429 for it: each answers 429 with Retry-After, as the document says.
func guessAnswers(t *testing.T, s *served, doc *openapitest.Doc) {
	t.Helper()
	token := s.token
	s.token = "wrong-guess"
	defer func() { s.token = token }()
	for i := 0; ; i++ {
		resp, b := s.request("GET", "/healthz", nil, nil, false)
		if resp.StatusCode == 429 {
			break
		}
		if resp.StatusCode != 401 || i == 100 {
			t.Fatalf("wrong token %d: %d %.200s; want 401 until 429", i+1, resp.StatusCode, b)
		}
	}
	for _, op := range doc.Operations() {
		method, path, _ := strings.Cut(op, " ")
		if !slices.Contains(doc.Responses(op), op+" 429") {
			continue
		}
		path = strings.NewReplacer("{run}", "ar-1", "{id}", "x", "{path}", "a.txt", "{pid}", "1", "{port}", "8000").Replace(path)
		var body io.Reader
		var hdr map[string]string
		if path == "/ui/login" {
			s.token = "" // the form's token is the guess
			body, hdr = strings.NewReader("token=wrong-guess"), map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
		}
		resp, b := s.request(method, path, body, hdr, false)
		s.token = "wrong-guess"
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s, throttled: %d, Retry-After %q, %.200s; want 429 with Retry-After", method, path, resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
	}
}

// waitServeRunning waits until s has n runs going on.
func waitServeRunning(t *testing.T, s *served, n int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var h server.Health
		s.get("/healthz", &h)
		if h.Running >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs going on; want %d", h.Running, n)
		}
	}
}

// tooBig sends the head of a task larger than the maximum, without its
// body, which the server refuses from its Content-Length.
func tooBig(t *testing.T, s *served, doc *openapitest.Doc) {
	t.Helper()
	declaredTooBig(t, s, "POST", "/v1/runs", 64<<20)
}

// declaredTooBig sends method path with a Content-Length of n and no
// body: the answer must be 413, and as the document says.
func declaredTooBig(t *testing.T, s *served, method, path string, n int) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, path, s.token, n)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 {
		t.Errorf("%s %s of %d bytes: %d %s; want 413", method, path, n, resp.StatusCode, b)
	}
	checkAnswer(t, method, path, resp, b)
}

// sandboxAnswers gets every answer of the live sandboxes' endpoints
// that can be had here (sandboxes.max is 1), through expect.
func sandboxAnswers(t *testing.T, s *served, expect func(method, path, body string, want int) []byte) {
	t.Helper()
	busybox := `{"image": "` + busyboxImage + `"}`
	// The image's refusals first: with a sandbox live, sandboxes.max
	// refuses before the image is looked at.
	expect("POST", "/v1/sandboxes", `{"image": "dir:`+filepath.Join(*imagesDir, "no-such", "rootfs")+`"}`, 422)
	expect("POST", "/v1/sandboxes", `{"image": "127.0.0.1:1/x:1"}`, 502)
	var sb struct{ ID string }
	if err := json.Unmarshal(expect("POST", "/v1/sandboxes", busybox, 201), &sb); err != nil {
		t.Fatal(err)
	}
	expect("POST", "/v1/sandboxes", busybox, 503) // sandboxes.max is 1
	expect("POST", "/v1/sandboxes", `{"session": "s"}`, 400)
	expect("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "limits": {"memory": "100g"}}`, 403)
	declaredTooBig(t, s, "POST", "/v1/sandboxes", 64<<20)
	expect("GET", "/v1/sandboxes", "", 200)
	path := "/v1/sandboxes/" + sb.ID
	none := "/v1/sandboxes/sb-" + strings.Repeat("0", 32)
	expect("GET", path, "", 200)
	expect("GET", none, "", 404)
	expect("POST", path+"/timeout", `{"timeout": "3m"}`, 200)
	expect("POST", path+"/timeout", `{"timeout": "3h"}`, 400)
	expect("POST", none+"/timeout", `{"timeout": "3m"}`, 404)
	declaredTooBig(t, s, "POST", path+"/timeout", 1<<20)

	procs := path + "/processes"
	expect("POST", procs, `{"cmd": "head -c 17000000 /dev/zero > big; echo done"}`, 200)
	var bg struct{ Pid int }
	if err := json.Unmarshal(expect("POST", procs+"?wait=false", `{"cmd": "read x; sleep 60", "stdin": true}`, 200), &bg); err != nil {
		t.Fatal(err)
	}
	expect("POST", procs, `{}`, 400)
	expect("POST", none+"/processes", `{"cmd": "true"}`, 404)
	declaredTooBig(t, s, "POST", procs, 1<<20)
	expect("GET", procs, "", 200)
	expect("GET", none+"/processes", "", 404)
	proc := fmt.Sprintf("%s/%d", procs, bg.Pid)
	expect("POST", proc+"/stdin", `{"data": "a", "data_b64": "Yg=="}`, 400)
	expect("POST", proc+"/stdin", `{"data": "line\n", "close": true}`, 204)
	expect("POST", proc+"/stdin", `{"data": "more"}`, 409)
	expect("POST", procs+"/999999/stdin", `{"data": "a"}`, 404)
	declaredTooBig(t, s, "POST", proc+"/stdin", 4<<20)
	expect("POST", proc+"/signal", `{"signal": "SIGNOPE"}`, 400)
	expect("POST", proc+"/signal", `{"signal": "SIGKILL"}`, 204)
	expect("GET", proc+"/events", "", 200) // to its exit
	expect("POST", proc+"/signal", `{"signal": "SIGKILL"}`, 409)
	expect("POST", procs+"/999999/signal", `{"signal": "SIGINT"}`, 404)
	declaredTooBig(t, s, "POST", proc+"/signal", 1<<20)
	expect("GET", procs+"/999999/events", "", 404)
	// A pseudo-terminal: made, resized, refused out of bounds, ended.
	var tp struct{ Pid int }
	if err := json.Unmarshal(expect("POST", procs+"?wait=false", `{"command": ["/bin/sh"], "tty": {"rows": 24, "cols": 80}}`, 200), &tp); err != nil {
		t.Fatal(err)
	}
	expect("POST", procs, `{"cmd": "true", "tty": {"rows": 1001, "cols": 80}}`, 400)
	tproc := fmt.Sprintf("%s/%d", procs, tp.Pid)
	expect("POST", tproc+"/resize", `{"rows": 50, "cols": 120}`, 204)
	expect("POST", tproc+"/resize", `{"rows": 0, "cols": 120}`, 400)
	expect("POST", procs+"/999999/resize", `{"rows": 5, "cols": 5}`, 404)
	declaredTooBig(t, s, "POST", tproc+"/resize", 1<<20)
	expect("POST", tproc+"/stdin", `{"data": "exit\n"}`, 204)
	expect("GET", tproc+"/events", "", 200) // to its exit
	expect("POST", tproc+"/resize", `{"rows": 5, "cols": 5}`, 409)

	// A port: busybox's httpd serves /workspace on 8000.
	expect("PUT", path+"/files/port.txt", "served", 204)
	expect("POST", procs+"?wait=false", `{"command": ["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/workspace"]}`, 200)
	ports := path + "/ports/"
	for i := 0; ; i++ {
		resp, b := s.request("GET", ports+"8000/port.txt", nil, nil, false)
		if resp.StatusCode == 200 && string(b) == "served" {
			break
		}
		if resp.StatusCode != 502 || i == 300 {
			t.Fatalf("GET %s8000/port.txt: %d %.200s", ports, resp.StatusCode, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	expect("GET", ports+"8001/x", "", 502)
	expect("POST", ports+"8001/x", "x", 502)
	expect("GET", ports+"0/x", "", 400)
	expect("POST", ports+"0/x", "x", 400)
	expect("GET", none+"/ports/8000/x", "", 404)
	expect("POST", none+"/ports/8000/x", "x", 404)

	files := path + "/files/"
	expect("PUT", files+"in/a.txt", "hello", 204)
	expect("GET", files+"in/a.txt", "", 200)
	expect("GET", files+"in?list=1", "", 200)
	expect("GET", files+"in/missing", "", 404)
	expect("GET", files+"a%00b", "", 400)
	expect("GET", files+"big", "", 413)
	expect("GET", none+"/files/a.txt", "", 404)
	expect("PUT", files+"a%00b", "x", 400)
	expect("PUT", none+"/files/a.txt", "x", 404)
	declaredTooBig(t, s, "PUT", files+"big", 16<<20+1)
	if resp, b := s.request("PUT", files+"chunked", io.MultiReader(strings.NewReader("x")), nil, false); resp.StatusCode != 411 {
		t.Errorf("PUT without a Content-Length: %d %s; want 411", resp.StatusCode, b)
	}
	expect("DELETE", files+"in/a.txt", "", 204)
	expect("DELETE", files+"a%00b", "", 400)
	expect("DELETE", none+"/files/a.txt", "", 404)
	expect("DELETE", path, "", 204)
	expect("DELETE", path, "", 404)
}

// mcpAnswers speaks MCP's Streamable HTTP on /mcp as far as the document
// describes it: a session opened, a notification accepted, the listening
// stream opened, the session ended, and the transport's refusals.
func mcpAnswers(t *testing.T, s *served) {
	t.Helper()
	both := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for _, h := range []map[string]string{both, extra} {
			for k, v := range h {
				m[k] = v
			}
		}
		return m
	}
	call := func(method, body string, hdr map[string]string, want int) *http.Response {
		t.Helper()
		resp, b := s.request(method, "/mcp", strings.NewReader(body), hdr, method == "GET" && want == 200)
		if resp.StatusCode != want {
			t.Errorf("%s /mcp %.80s: %d %.200s; want %d", method, body, resp.StatusCode, b, want)
		}
		return resp
	}
	resp := call("POST", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"openapi-test","version":"1"}}}`, both, 200)
	sid := map[string]string{"Mcp-Session-Id": resp.Header.Get("Mcp-Session-Id"), "Mcp-Protocol-Version": "2025-06-18"}
	call("POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, with(sid), 202)
	call("POST", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, with(sid), 200)
	call("GET", "", with(sid), 200)
	call("POST", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`, both, 400)
	call("POST", `x`, with(map[string]string{"Content-Type": "text/plain"}), 415)
	call("POST", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, with(map[string]string{"Mcp-Session-Id": "nosuch"}), 404)
	call("GET", "", both, 400)
	call("GET", "", with(map[string]string{"Mcp-Session-Id": "nosuch"}), 404)
	call("PUT", "", both, 405)
	call("DELETE", "", with(sid), 204)
	call("DELETE", "", with(sid), 404)
	call("DELETE", "", both, 400)
}

// outsideValidator validates the OpenAPI document doc with an outside
// validator, @apidevtools/swagger-parser (npm, test/openapi-validator):
// against the OpenAPI 3.1 JSON Schema, then its own checks. A copy with
// an undeclared path parameter must fail it, or the validator checks
// nothing.
func outsideValidator(t *testing.T, doc []byte) {
	t.Helper()
	dir := npmPackages(t, "openapi-validator", "@apidevtools/swagger-parser")
	validate := func(doc []byte) (string, error) {
		f := filepath.Join(t.TempDir(), "openapi.json")
		if err := os.WriteFile(f, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("node", filepath.Join(dir, "validate.mjs"), f).CombinedOutput()
		return string(out), err
	}
	if out, err := validate(doc); err != nil {
		t.Errorf("the outside validator refuses the served document: %v\n%s", err, out)
	} else {
		t.Logf("outside validator: %s", out)
	}
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	removed := m["paths"].(map[string]any)["/v1/sessions/{id}"].(map[string]any)["delete"].(map[string]any)["responses"].(map[string]any)["204"].(map[string]any)
	delete(removed, "description")
	broken, _ := json.Marshal(m)
	if out, err := validate(broken); err == nil {
		t.Errorf("the outside validator accepts a document with a response without its description: %s", out)
	}
}

// npmPackages is test/NAME, whose package-lock.json npm installs (make
// mcp-client, make openapi-validator) unless module is there already.
func npmPackages(t *testing.T, name, module string) string {
	t.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "test", name)
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is missing (test/deps.sh installs nodejs and npm)")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", filepath.FromSlash(module))); err != nil {
		npm := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		npm.Dir = dir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

// pageAnswers goes through the approvals page while ev's request is
// held: its files, its login (wrong, then right), the list and the
// refusals of a decision (no credentials, no CSRF token with the cookie,
// a bad form, no such approval), then denies ev's request with the
// cookie and its CSRF token.
func pageAnswers(t *testing.T, s *served, ev server.Event) {
	t.Helper()
	form := func(kv ...string) (io.Reader, map[string]string) {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return strings.NewReader(v.Encode()), map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	}
	expect := func(method, path string, body io.Reader, hdr map[string]string, want int) (*http.Response, []byte) {
		t.Helper()
		resp, b := s.request(method, path, body, hdr, false)
		if resp.StatusCode != want {
			t.Errorf("%s %s: %d %.300s; want %d", method, path, resp.StatusCode, b, want)
		}
		return resp, b
	}
	for _, p := range []string{"/ui/approvals", "/ui/approvals.js", "/ui/approvals.css"} {
		expect("GET", p, nil, nil, 200)
		expect("HEAD", p, nil, nil, 200)
	}
	expect("GET", "/ui/approvals.json", nil, nil, 200)
	token := s.token
	s.token = ""
	defer func() { s.token = token }()
	expect("GET", "/ui/approvals", nil, nil, 200) // the login form
	expect("GET", "/ui/approvals.json", nil, nil, 401)
	body, hdr := form("run", ev.Run, "id", ev.Approval.ID, "approve", "true")
	expect("POST", "/ui/decide", body, hdr, 401)
	body, hdr = form("token", "wrong")
	expect("POST", "/ui/login", body, hdr, 401)
	// Logged in: a 303 to the page with the cookie, not followed.
	client := s.client
	noFollow := *client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s.client = &noFollow
	body, hdr = form("token", token)
	resp, _ := expect("POST", "/ui/login", body, hdr, 303)
	s.client = client
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "agentrun_ui" {
			cookie = c.Name + "=" + c.Value
		}
	}
	if cookie == "" {
		t.Fatalf("login set no cookie: %v", resp.Header)
	}
	withCookie := func(h map[string]string) map[string]string {
		h["Cookie"] = cookie
		return h
	}
	_, page := expect("GET", "/ui/approvals", nil, withCookie(map[string]string{}), 200)
	csrf := regexp.MustCompile(`[0-9a-f]{64}`).Find(page)
	if csrf == nil {
		t.Fatalf("no CSRF token in the page: %s", page)
	}
	expect("GET", "/ui/approvals.json", nil, withCookie(map[string]string{}), 200)
	body, hdr = form("run", ev.Run, "id", ev.Approval.ID, "approve", "true")
	expect("POST", "/ui/decide", body, withCookie(hdr), 403)
	body, hdr = form("run", ev.Run, "id", ev.Approval.ID, "approve", "maybe", "csrf", string(csrf))
	expect("POST", "/ui/decide", body, withCookie(hdr), 400)
	body, hdr = form("run", ev.Run, "id", "nosuch", "approve", "true", "csrf", string(csrf))
	expect("POST", "/ui/decide", body, withCookie(hdr), 404)
	body, hdr = form("run", ev.Run, "id", ev.Approval.ID, "approve", "false", "csrf", string(csrf))
	expect("POST", "/ui/decide", body, withCookie(hdr), 200)
}
