package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/runapi"
)

// portServer is a Python server for a sandbox's port: GET answers the
// path and headers it got as JSON, POST echoes its body, and GET /ws
// switches to a protocol "echo" that sends back every byte.
const portServer = `import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "app=1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/ws":
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while True:
                b = self.request.recv(65536)
                if not b:
                    break
                self.request.sendall(b)
            self.close_connection = True
            return
        self.reply(json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode())
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.reply(self.rfile.read(n))
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// portGot is what portServer answers a GET.
type portGot struct {
	Path    string
	Headers map[string]string
}

// portRequest sends method path (with the Host host, if not "") with hdr
// to s and returns the answer, read whole.
func portRequest(t *testing.T, s *served, method, host, path string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestServeSandboxPorts: a process listening on a port of a live
// sandbox (with no network) is reached through serve, by path and by a
// name of server.preview_domain, with the API token or the sandbox's
// preview token and never without; neither token reaches the sandbox;
// bodies stream both ways and an upgrade is passed through; another
// sandbox cannot reach the port; an ended sandbox's port is 404.
//
// On runsc the port is gVisor's netstack's, reached by runsc
// port-forward, not the sandbox namespace's loopback.
func TestServeSandboxPorts(t *testing.T) { eachRuntime(t, testServeSandboxPorts) }

func testServeSandboxPorts(t *testing.T, rt string) {
	const token = "p0rts-token"
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock"), "token": token,
		"preview_domain": "preview.test"}, map[string]any{"local_images": []string{*imagesDir}})
	cfg["runtime"] = rt
	s := startServeWith(t, cfg)
	create := func() runapi.SandboxInfo {
		resp, b := s.do("POST", "/v1/sandboxes", `{"image": "`+pythonImage+`", "timeout": "2m"}`)
		var sb runapi.SandboxInfo
		if err := json.Unmarshal(b, &sb); resp.StatusCode != 201 || err != nil {
			t.Fatalf("POST /v1/sandboxes: %d %s", resp.StatusCode, b)
		}
		return sb
	}
	a, b := create(), create()
	if resp, body := s.do("PUT", "/v1/sandboxes/"+a.ID+"/files/srv.py", portServer); resp.StatusCode != 204 {
		t.Fatalf("PUT srv.py: %d %s", resp.StatusCode, body)
	}
	if resp, body := s.do("POST", "/v1/sandboxes/"+a.ID+"/processes?wait=false", `{"command": ["python3", "srv.py", "8000"]}`); resp.StatusCode != 200 {
		t.Fatalf("starting the server: %d %s", resp.StatusCode, body)
	}
	port := "/v1/sandboxes/" + a.ID + "/ports/8000"
	bearer := map[string]string{"Authorization": "Bearer " + token}

	// With the API token, once the server listens.
	var got portGot
	for i := 0; ; i++ {
		resp, body := portRequest(t, s, "GET", "", port+"/some/path?x=1&y=%2F", nil, bearer)
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if resp.Header.Get("Set-Cookie") != "" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "sandbox") {
				t.Errorf("by path: Set-Cookie %q, Content-Security-Policy %q; want none, and sandbox", resp.Header.Get("Set-Cookie"), resp.Header.Get("Content-Security-Policy"))
			}
			break
		}
		if resp.StatusCode != 502 || i == 300 {
			t.Fatalf("GET %s: %d %s", port, resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got.Path != "/some/path?x=1&y=%2F" || got.Headers["authorization"] != "" || got.Headers["host"] != "localhost:8000" {
		t.Errorf("the sandbox got %+v", got)
	}

	// With the preview token, by header or query; neither reaches it.
	for _, c := range []struct {
		path string
		hdr  map[string]string
	}{{port + "/h", map[string]string{"X-Agentrun-Preview-Token": a.PreviewToken, "Cookie": "agentrun_ui=secret; app=2"}},
		{port + "/q?a=b&preview_token=" + a.PreviewToken, nil}} {
		resp, body := portRequest(t, s, "GET", "", c.path, nil, c.hdr)
		got = portGot{}
		if err := json.Unmarshal(body, &got); resp.StatusCode != 200 || err != nil {
			t.Fatalf("GET %s with the preview token: %d %s", c.path, resp.StatusCode, body)
		}
		if strings.Contains(string(body), a.PreviewToken) || strings.Contains(string(body), "secret") || (c.hdr != nil && got.Headers["cookie"] != "app=2") {
			t.Errorf("the sandbox got the preview token or serve's cookie: %s", body)
		}
	}

	// Never without: no token, a wrong one, another sandbox's.
	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer nope"}, {"X-Agentrun-Preview-Token": "nope"},
		{"X-Agentrun-Preview-Token": b.PreviewToken}} {
		if resp, body := portRequest(t, s, "GET", "", port+"/", nil, hdr); resp.StatusCode != 401 || strings.Contains(string(body), "headers") {
			t.Errorf("GET %s with %v: %d %s; want 401", port, hdr, resp.StatusCode, body)
		}
	}

	// A body streams in and back out.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	if resp, body := portRequest(t, s, "POST", "", port+"/echo", bytes.NewReader(big), bearer); resp.StatusCode != 200 || !bytes.Equal(body, big) {
		t.Errorf("POST 1 MiB: %d, %d bytes back", resp.StatusCode, len(body))
	}

	// An upgrade: the connection switches and carries bytes both ways.
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.base+port+"/ws", nil)
		req.Header.Set("X-Agentrun-Preview-Token", a.PreviewToken)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatalf("upgrade: %v", err)
		}
		defer resp.Body.Close()
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if resp.StatusCode != 101 || !ok {
			t.Fatalf("upgrade: %d %T", resp.StatusCode, resp.Body)
		}
		for _, msg := range []string{"ping", strings.Repeat("x", 100000)} {
			if _, err := rwc.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			back := make([]byte, len(msg))
			if _, err := io.ReadFull(rwc, back); err != nil || string(back) != msg {
				t.Fatalf("echo of %d bytes: %v", len(msg), err)
			}
		}
	}()

	// By the preview domain's name PORT-ID: the same, the API not there.
	name := "8000-" + a.ID + ".preview.test"
	resp, body := portRequest(t, s, "GET", name, "/v1/sandboxes?preview_token="+a.PreviewToken, nil, nil)
	got = portGot{}
	if err := json.Unmarshal(body, &got); resp.StatusCode != 200 || err != nil || got.Path != "/v1/sandboxes" {
		t.Errorf("GET by %s: %d %s", name, resp.StatusCode, body)
	}
	if resp, body := portRequest(t, s, "GET", name, "/", nil, nil); resp.StatusCode != 401 {
		t.Errorf("GET by %s with no token: %d %s; want 401", name, resp.StatusCode, body)
	}
	if resp, body := portRequest(t, s, "GET", name, "/", nil, map[string]string{"X-Agentrun-Preview-Token": a.PreviewToken, "Origin": "http://elsewhere.test"}); resp.StatusCode != 403 {
		t.Errorf("GET by %s from another origin: %d %s; want 403", name, resp.StatusCode, body)
	}
	// A preview name's page may not call the API.
	if resp, body := portRequest(t, s, "GET", "", "/v1/sandboxes", nil, map[string]string{"Authorization": "Bearer " + token, "Origin": "http://" + name}); resp.StatusCode != 403 {
		t.Errorf("the API from %s's origin: %d %s; want 403", name, resp.StatusCode, body)
	}
	if resp, _ := portRequest(t, s, "GET", "8000-"+a.ID+".other.test", "/", nil, bearer); resp.StatusCode != 421 {
		t.Errorf("a name of another domain: %d; want 421", resp.StatusCode)
	}

	// Another sandbox cannot reach it: its loopback is its own.
	resp, body = s.do("POST", "/v1/sandboxes/"+b.ID+"/processes", `{"command": ["python3", "-c", "import urllib.request\ntry:\n  urllib.request.urlopen('http://127.0.0.1:8000/', timeout=5); print('reached')\nexcept Exception as e: print('refused', e)"]}`)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"data":"refused`)) || bytes.Contains(body, []byte("reached")) {
		t.Errorf("another sandbox to 127.0.0.1:8000: %d %s", resp.StatusCode, body)
	}

	// Ended: its port is no more.
	if resp, body := s.do("DELETE", "/v1/sandboxes/"+a.ID, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, body)
	}
	if resp, body := portRequest(t, s, "GET", "", port+"/", nil, bearer); resp.StatusCode != 404 {
		t.Errorf("the port of a deleted sandbox: %d %s; want 404", resp.StatusCode, body)
	}
	s.stop()
	assertNoLeaks(t)
}
