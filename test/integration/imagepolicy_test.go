package integration

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/result"
)

// hostService is an HTTP service on the host's loopback that answers
// every request with a 404 page holding a secret, and counts requests.
func hostService(t *testing.T, secret string) (host string, hits *atomic.Int64) {
	t.Helper()
	hits = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, secret, http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), hits
}

// imagePolicyRun runs echo45(ref) through the CLI under a config with no
// network for tasks, the given policy.registries and an audit log, and
// returns the result, stderr and the audit record.
func imagePolicyRun(t *testing.T, ref string, registries ...string) (*result.Result, string, *audit.Record) {
	t.Helper()
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	policy := map[string]any{"allow_network": false}
	if len(registries) > 0 {
		policy["registries"] = registries
	}
	cfgPath := writeConfig(t, map[string]any{"image": busyboxImage, "state_dir": stateDir, "store_dir": newStoreDir(t),
		"audit": auditPath, "policy": policy})
	stdout, stderr, code := agentrun(t, echo45(ref), "run", "--config", cfgPath, "-")
	if code != 125 {
		t.Fatalf("exit %d; want 125\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	var res result.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("result is not JSON: %v\n%s", err, stdout)
	}
	b, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	var rec audit.Record
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("audit record: %v\n%s", err, b)
	}
	assertNoLeaks(t)
	return &res, stderr, &rec
}

// A task's image field naming a host service (127.0.0.1:PORT/...) makes
// no request when the policy does not list it, even with the network
// allowed to nobody; listed, the service's error page reaches the audit
// record and stderr, never the result.
func TestImageFieldCannotReachHostServices(t *testing.T) {
	const secret = "host-admin-page-7f3a9c"
	svc, hits := hostService(t, secret)
	ref := svc + "/any/thing:tag"

	res, _, rec := imagePolicyRun(t, ref)
	if hits.Load() != 0 {
		t.Fatalf("the host service got %d requests from an image field the policy does not list", hits.Load())
	}
	if !strings.Contains(res.Error, "refused by policy") || !strings.Contains(res.Error, "policy.registries") {
		t.Errorf("error %q does not say the policy refused it", res.Error)
	}
	if rec.Error != res.Error {
		t.Errorf("audit error %q, result error %q", rec.Error, res.Error)
	}

	res, stderr, rec := imagePolicyRun(t, ref, svc)
	if hits.Load() == 0 {
		t.Fatal("a listed registry was never asked: the test proves nothing")
	}
	if strings.Contains(res.Error, secret) || !strings.Contains(res.Error, "image not found") {
		t.Errorf("result error %q: want the kind only, not the service's page", res.Error)
	}
	if !strings.Contains(rec.Detail, secret) || !strings.Contains(stderr, secret) {
		t.Errorf("the service's answer is missing from the audit detail %q or stderr %q", rec.Detail, stderr)
	}
}

// Whether a port is open, closed or speaks HTTP, an unlisted registry
// gets the same answer: the image field cannot scan ports.
func TestImageFieldCannotScanPorts(t *testing.T) {
	svc, _ := hostService(t, "x")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	var errs []string
	for _, host := range []string{svc, closed} {
		res, _, _ := imagePolicyRun(t, host+"/x/y:z")
		errs = append(errs, strings.ReplaceAll(res.Error, host, "HOST"))
	}
	if errs[0] != errs[1] {
		t.Errorf("open port: %q\nclosed port: %q", errs[0], errs[1])
	}
}

// A listed registry that redirects its blobs to a host service it does
// not list (by address or by a name resolving to loopback) is refused
// when the redirect is dialled: the service sees no request, the result
// does not say where the redirect led.
func TestImageRedirectToHostServiceRefused(t *testing.T) {
	svc, hits := hostService(t, "secret")
	_, port, _ := net.SplitHostPort(svc)
	for _, to := range []string{svc, "localhost:" + port} {
		host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
					http.Redirect(w, r, "http://"+to+"/admin", http.StatusFound)
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		imagetest.Push(t, host, "agentrun/busybox", "1", layoutImage(t, busyboxLayout(), "latest"))
		res, _, rec := imagePolicyRun(t, host+"/agentrun/busybox:1", host)
		if !strings.Contains(res.Error, "refused by policy") || strings.Contains(res.Error, port) {
			t.Errorf("redirect to %s: error %q", to, res.Error)
		}
		if !strings.Contains(rec.Detail, to) {
			t.Errorf("redirect to %s: audit detail %q does not say where it led", to, rec.Detail)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the host service got %d requests through redirects", n)
	}
}

// Over serve, an image failure is a refusal of its kind naming the image
// field (403 for the policy, 422 for a missing image), never a 500, and
// the service's page stays out of it; the server's log has it.
func TestServeImageErrorStatus(t *testing.T) {
	const secret = "host-admin-page-b81d"
	svc, hits := hostService(t, secret)
	s := startServeCfg(t, map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "i.sock")},
		map[string]any{"registries": []string{svc}})
	for _, tc := range []struct {
		ref  string
		want int
	}{
		{"127.0.0.1:1/any/thing:tag", http.StatusForbidden},
		{svc + "/any/thing:tag", http.StatusUnprocessableEntity},
		{"/srv/rootfs", http.StatusBadRequest},
	} {
		var body struct{ Error, Field string }
		resp := s.post(echo45(tc.ref), &body)
		if resp.StatusCode != tc.want || body.Field != "image" || !strings.Contains(body.Error, tc.ref) || strings.Contains(body.Error, secret) {
			t.Errorf("%s: status %d %+v; want %d naming the image", tc.ref, resp.StatusCode, body, tc.want)
		}
	}
	if hits.Load() == 0 || !strings.Contains(s.log(), secret) {
		t.Errorf("the listed service was not asked (%d requests) or its answer is not in the server's log:\n%s", hits.Load(), s.log())
	}
	s.stop()
}
