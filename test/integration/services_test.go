package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

const serviceSecret = "agentrun-test-secret-5f2c9e1d7b"

// serviceConfig is netConfig with service "api" at
// https://api.internet.test, verified through network.ca_files, with a
// root-only secret injected as Authorization: GET under /api/read/, POST
// to /api/write/* with approval.
func serviceConfig(t *testing.T, in *proxytest.Internet, rt string) (*config.Config, *proxytest.HeaderLog) {
	t.Helper()
	// An API under /api/ that records the Authorization header of each
	// request it gets (never echoing it).
	up := &proxytest.HeaderLog{Name: "Authorization"}
	in.Mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		up.Record(r)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "api %s %s %s", r.Method, r.URL.EscapedPath(), b)
	})
	cfg := netConfigFor(t, in, rt)
	cfg.Network.Hosts["api.internet.test"] = in.IP
	dir := t.TempDir()
	ca, secret := filepath.Join(dir, "internet-ca.pem"), filepath.Join(dir, "api-token")
	if err := os.WriteFile(ca, in.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(serviceSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Network.CAFiles = []string{ca}
	cfg.Network.ApprovalTimeout = config.MustDuration("3s")
	cfg.Network.Services = map[string]config.Service{"api": {
		URL:    "https://api.internet.test",
		Inject: map[string]config.Inject{"Authorization": {Prefix: "Bearer ", File: secret}},
		Rules: []config.ServiceRule{
			{Methods: []string{"GET"}, Paths: []string{"/api/read/**"}},
			{Methods: []string{"POST"}, Paths: []string{"/api/write/*"}, Approve: true},
		},
	}}
	// Validate converts the services once, as Load does; the runner
	// takes them from there (config.Network.ProxyService).
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the services config: %v", err)
	}
	return cfg, up
}

// searchPy looks for the secret (given in a file in the workspace, which it
// skips) and any private key in the environment, /proc and every readable
// file, and prints what it finds.
const searchPy = `
import os, stat, time
secret = open("/workspace/needle").read().strip().encode()
hits, files_read = [], 0
open("/tmp/control", "wb").write(secret)  # the search must find this one
for k, v in os.environ.items():
    if secret in (k + "=" + v).encode() or b"PRIVATE KEY" in v.encode():
        hits.append("env " + k)
def scan(path):
    global files_read
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return
        with open(path, "rb") as f:
            data = f.read(4 << 20)
    except Exception:
        return
    files_read += 1
    if secret in data:
        hits.append(path)
    if b"PRIVATE" + b" KEY-----" in data:
        hits.append("key " + path)
deadline = time.time() + 20
for root, dirs, files in os.walk("/", followlinks=False):
    if time.time() > deadline:
        hits.append("search incomplete")
        break
    if root in ("/sys", "/dev") or root.startswith(("/sys/", "/dev/")):
        dirs[:] = []
        continue
    for name in files:
        p = os.path.join(root, name)
        if p in ("/workspace/needle", "/proc/kcore") or name in ("pagemap", "mem", "kmsg", "clear_refs"):
            continue
        scan(p)
print("read", files_read > 100)
print("HITS", hits)
`

func TestServiceInjectionNoTrace(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		cfg, up := serviceConfig(t, in, rt)
		auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
		log, err := audit.Open(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		code := fetchPy + `
import ssl, urllib.request, hashlib
out = []
out.append(fetch("https://api.internet.test/api/read/x"))
out.append(fetch("https://api.internet.test/api/other"))
req = urllib.request.Request("https://api.internet.test/api/write/x", data=b"hello", method="POST")
try:
    r = urllib.request.urlopen(req, timeout=10); out.append("%d %s" % (r.status, r.read().decode()))
except urllib.error.HTTPError as e:
    out.append("%d %s" % (e.code, e.read().decode().strip()))
out.append(fetch("https://api.internet.test/api/read/..%2f..%2fother"))
# A host that is not a service is a blind tunnel: its own certificate,
# trusted through the fake host's CA alone.
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
r = urllib.request.urlopen("https://www.internet.test/hello", context=ctx, timeout=10)
out.append("%d %s" % (r.status, r.read().decode()))
import socket
s = socket.create_connection((os.environ["HTTPS_PROXY"].split("//")[1].split(":")[0], 3128))
s.sendall(b"CONNECT www.internet.test:443 HTTP/1.1\r\nHost: www.internet.test\r\n\r\n")
s.recv(4096)
ts = ctx.wrap_socket(s, server_hostname="www.internet.test")
out.append("issuer " + dict(x[0] for x in ts.getpeercert()["issuer"])["commonName"])
ts.close()
for line in out:
    print(line)
ca = open("/etc/agentrun-ca/ca.pem", "rb").read()
sysb = "/etc/ssl/certs/ca-certificates.crt"
print("bundle", (ca in open(sysb, "rb").read()) if os.path.exists(sysb) else "absent", ca in open(os.environ["SSL_CERT_FILE"], "rb").read())
try:
    open("/etc/agentrun-ca/ca.pem", "ab")
    print("ca writable")
except OSError:
    print("ca read-only")
print("ca", hashlib.sha256(ca).hexdigest())
` + searchPy
		b, _ := json.Marshal(map[string]any{
			"code": code,
			"files": map[string]any{
				"ca.pem": map[string]string{"content": string(in.CAPEM)},
				"needle": map[string]string{"content": serviceSecret},
			},
			"network": map[string]any{"services": []string{"api"}, "allow": []string{"www.internet.test"}},
			"limits":  map[string]any{"timeout": "40s"},
		})
		// The test image has no system bundle unless it has ca-certificates.
		sysBundle := "absent"
		if _, err := os.Stat(filepath.Join(strings.TrimPrefix(pythonImage, "dir:"), "etc/ssl/certs/ca-certificates.crt")); err == nil {
			sysBundle = "True"
		}
		res := runTaskWith(t, cfg, log, string(b))
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		want := []string{
			"200 api GET /api/read/x ",
			"403 agentrun: request to api.internet.test:443 denied: no rule of service api allows GET /api/other",
			"403 agentrun: denied by the operator",
			"403 agentrun: request to api.internet.test:443 denied: path has an encoded slash, backslash or NUL",
			"200 hello from www.internet.test over https",
			"issuer internet.test",
			"bundle " + sysBundle + " True",
			"ca read-only",
		}
		if len(lines) < len(want)+3 {
			t.Fatalf("stdout %q\nstderr %q", res.Stdout, res.Stderr)
		}
		for i, w := range want {
			if lines[i] != w {
				t.Errorf("line %d = %q; want %q", i, lines[i], w)
			}
		}
		if got := strings.Join(lines[len(lines)-2:], "\n"); got != "read True\nHITS ['/tmp/control']" {
			t.Errorf("the sandbox's search: %s", got)
		}
		if got := up.Got(); len(got) != 1 || got[0] != "Bearer "+serviceSecret {
			t.Errorf("upstream saw Authorization %q; want one request with the injected value", got)
		}
		js, _ := json.Marshal(res)
		rec, err := os.ReadFile(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		for where, data := range map[string]string{"result": string(js), "audit": string(rec)} {
			if strings.Contains(data, serviceSecret) {
				t.Errorf("%s holds the secret", where)
			}
			if where == "audit" && !strings.Contains(data, `"network_services":["api"]`) {
				t.Errorf("audit record does not name the services asked for: %s", data)
			}
			if !strings.Contains(data, `"injected":["Authorization"]`) || !strings.Contains(data, `"by":"no way to ask"`) {
				t.Errorf("%s lacks the injection or the approval decision: %s", where, data)
			}
		}

		// A new run gets a new CA.
		res2 := runTaskWith(t, cfg, nil, `{"code":"import hashlib; print('ca', hashlib.sha256(open('/etc/agentrun-ca/ca.pem','rb').read()).hexdigest())","network":{"services":["api"]}}`)
		var ca1 string
		for _, l := range lines {
			if strings.HasPrefix(l, "ca ") {
				ca1 = l
			}
		}
		if ca2 := strings.TrimSpace(res2.Stdout); ca1 == "" || !strings.HasPrefix(ca2, "ca ") || ca2 == ca1 {
			t.Errorf("CA of two runs: %q and %q; want two different", ca1, ca2)
		}
	})
}

// TestServiceMountinfo: the files a service run is shown read-only (its
// CA, the system bundle it replaces, resolv.conf, hosts, passwd and group)
// come from a tmpfs of the run's own, so the sandbox's mountinfo names no
// host path of agentrun's state; the CA still verifies the service.
func TestServiceMountinfo(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		cfg, _ := serviceConfig(t, in, rt)
		code := fetchPy + `
print(fetch("https://api.internet.test/api/read/m"))
print(open("/proc/self/mountinfo").read())
`
		b, _ := json.Marshal(map[string]any{"code": code, "network": map[string]any{"services": []string{"api"}}})
		res := runTaskWith(t, cfg, nil, string(b))
		first, mountinfo, _ := strings.Cut(res.Stdout, "\n")
		if first != "200 api GET /api/read/m " {
			t.Errorf("the service through the run's CA: %q (stderr %q)", first, res.Stderr)
		}
		points := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(mountinfo), "\n") {
			if f := strings.Fields(line); len(f) > 4 {
				points[f[4]] = true
			}
			if strings.Contains(line, cfg.StateDir) {
				t.Errorf("mountinfo names the state dir %s: %s", cfg.StateDir, line)
			}
		}
		// The control: the mounts the check is about are listed.
		for _, p := range []string{runner.CADir, "/etc/resolv.conf", "/etc/hosts"} {
			if !points[p] {
				t.Errorf("mountinfo lists no mount at %s:\n%s", p, mountinfo)
			}
		}
	})
}

// TestServicePathSpellings: spellings of a path that Tomcat, Jetty or
// Spring (";" parameters dropped), a server decoding twice, or one
// reading overlong UTF-8 would take out of a rule's "**" are refused with
// 403 and never reach the upstream, which logs every request line it
// gets; the plain path passes.
func TestServicePathSpellings(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceConfig(t, in, "libcontainer")
	spellings := []string{
		"/api/read/..;/admin",
		"/api/read/.;/admin",
		"/api/read/..;x=1/admin",
		"/api/read/%2e%2e%3b/admin",
		"/api/read/%2e%2e;/admin",
		"/api/read/%2E.;/admin",
		"/api/read/x/..;",
		"/api/read/x/.;",
		"/api/read/;x/admin",
		"/api/read/%252e%252e/admin",
		"/api/read/%c0%ae%c0%ae/admin",
		"/api/read/.%c0%ae/admin",
		"/api/read/%e0%80%ae%e0%80%ae/admin",
		"/api/read/%f0%80%80%ae%f0%80%80%ae/admin",
		"/api/read/..%c0%afadmin",
		"/api/read/..%e0%80%afadmin",
	}
	code := fetchPy + "for p in " + pyList(spellings) + ` + ["/api/read/ok"]:
    print(fetch("https://api.internet.test" + p))
`
	b, _ := json.Marshal(map[string]any{"code": code, "network": map[string]any{"services": []string{"api"}}, "limits": map[string]any{"timeout": "60s"}})
	res := runTaskWith(t, cfg, nil, string(b))
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != len(spellings)+1 {
		t.Fatalf("stdout %q (stderr %q)", res.Stdout, res.Stderr)
	}
	for i, p := range spellings {
		if !strings.HasPrefix(lines[i], "403 agentrun: request to api.internet.test:443 denied: path has ") {
			t.Errorf("GET %s: %q; want 403, path refused", p, lines[i])
		}
	}
	if last := lines[len(spellings)]; last != "200 api GET /api/read/ok" {
		t.Errorf("the control, GET /api/read/ok: %q", last)
	}
	if got := receivedAPI(in); len(got) != 1 || got[0] != "GET /api/read/ok" {
		t.Errorf("upstream received %q; want the control alone", got)
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests with the credential; want 1", len(got))
	}
	for i, r := range res.Network.Requests {
		if i < len(spellings) && (r.Allowed || r.Path != spellings[i] || !strings.HasPrefix(r.Reason, "path has ")) {
			t.Errorf("request %d recorded as %+v; want %s refused", i, r, spellings[i])
		}
	}
}

// TRACE and TRACK from inside a sandbox are refused before the upstream,
// whose answer would echo the injected credential back, on a path a rule
// allows.
func TestServiceTraceRefused(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, up := serviceConfig(t, in, "libcontainer")
	code := fetchPy + `
for m in ["TRACE", "track", "GET"]:
    try:
        r = urllib.request.urlopen(urllib.request.Request("https://api.internet.test/api/read/ok", method=m), timeout=10)
        print("%d %s" % (r.status, r.read().decode()))
    except urllib.error.HTTPError as e:
        print("%d %s" % (e.code, e.read().decode().strip()))
`
	b, _ := json.Marshal(map[string]any{"code": code, "network": map[string]any{"services": []string{"api"}}, "limits": map[string]any{"timeout": "60s"}})
	res := runTaskWith(t, cfg, nil, string(b))
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("stdout %q (stderr %q)", res.Stdout, res.Stderr)
	}
	for i, m := range []string{"TRACE", "track"} {
		if want := "403 agentrun: request to api.internet.test:443 denied: method " + m + " echoes the request"; !strings.HasPrefix(lines[i], want) {
			t.Errorf("%s: %q; want %q...", m, lines[i], want)
		}
	}
	if lines[2] != "200 api GET /api/read/ok" {
		t.Errorf("the control, GET /api/read/ok: %q", lines[2])
	}
	if got := up.Got(); len(got) != 1 {
		t.Errorf("upstream got %d requests with the credential; want 1 (the control)", len(got))
	}
	if len(res.Network.Requests) != 3 || res.Network.Requests[0].Allowed || res.Network.Requests[1].Allowed {
		t.Errorf("requests recorded as %+v; want TRACE and track refused", res.Network.Requests)
	}
}
