package integration

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// allowProbePy fetches and resolves the fake internet's two names, one
// way each (explicit proxy, transparent, DNS), and an unlisted one. Last
// it prints how many TCP sockets its network namespace held when it
// started, and how many it leaves: its half-closed connection to the
// gateway outlives it in the namespace (FIN_WAIT2, then TIME_WAIT), so a
// namespace used again would show it to the next run.
const allowProbePy = `
def tcp_sockets():
    return len(open("/proc/net/tcp").read().splitlines()) - 1
at_start = tcp_sockets()
` + fetchPy + `
print(fetch("http://internet.test/hello"))
print(fetch("https://internet.test/hello", proxies=False))
print(resolve("internet.test") != "NXDOMAIN")
print(fetch("http://www.internet.test/hello"))
print(fetch("https://www.internet.test/hello", proxies=False))
print(resolve("www.internet.test") != "NXDOMAIN")
print(fetch("https://evil.example/"))
gw = os.environ["HTTP_PROXY"].split("//")[1].split(":")[0]
socket.create_connection((gw, 53), timeout=5).close()
print("tcp sockets: %d at start, %s left" % (at_start, "some" if tcp_sockets() > 0 else "none"))
`

// Lines of allowProbePy's answer under an allowlist of internet.test, of
// www.internet.test.
var (
	onlyInternet = []string{
		"200 hello from internet.test over http",
		"200 hello from internet.test over https",
		"True",
		"403 agentrun: egress to www.internet.test:80 denied: not in allowlist",
		"URLError [Errno -2] Name or service not known",
		"False",
		"URLError Tunnel connection failed: 403 Forbidden",
	}
	onlyWWW = []string{
		"403 agentrun: egress to internet.test:80 denied: not in allowlist",
		"URLError [Errno -2] Name or service not known",
		"False",
		"200 hello from www.internet.test over http",
		"200 hello from www.internet.test over https",
		"True",
		"URLError Tunnel connection failed: 403 Forbidden",
	}
)

// freshNetns is allowProbePy's last line in a network namespace new for
// its run.
const freshNetns = "tcp sockets: 0 at start, some left"

// probeLines is allowProbePy's answer, checked for a fresh namespace.
func probeLines(t *testing.T, res *result.Result) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.Error != "" || len(lines) != len(onlyInternet)+1 {
		t.Fatalf("run: error %q exit %d stdout %q stderr %q", res.Error, res.ExitCode, res.Stdout, res.Stderr)
	}
	if last := lines[len(lines)-1]; last != freshNetns {
		t.Errorf("run %s: %q; want %q (a network namespace of its own)", res.ID, last, freshNetns)
	}
	return lines[:len(lines)-1]
}

// decisions is a network section without byte counts (which follow the
// traffic, such as the TLS handshake, not the policy).
func decisions(n result.Network) result.Network {
	n.Allowed = slices.Clone(n.Allowed)
	for i := range n.Allowed {
		n.Allowed[i].BytesIn, n.Allowed[i].BytesOut = 0, 0
	}
	return n
}

// TestServeAllowlistRunsFromThePool: over serve, an allowlist task runs
// cold once (the pool held the default shape), then from the pool with
// the same answers and the same network section; two pooled runs back to
// back with other allowlists each get only their own; no run finds what
// another left in its network namespace; the pool's stats count the takes; and the
// server leaves nothing behind.
func TestServeAllowlistRunsFromThePool(t *testing.T) {
	in := proxytest.NewInternet(t)
	linksBefore := hostLinks(t)
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "agentrun.sock"),
		"pool": map[string]int{pythonImage: 1}}, map[string]any{"local_images": []string{*imagesDir}})
	cfg["network"] = map[string]any{
		"hosts":        map[string]string{"internet.test": in.IP.String(), "www.internet.test": in.IP.String()},
		"allow_ranges": []string{"198.18.0.0/15"},
	}
	s := startServeWith(t, cfg)
	waitPool := func() *server.PoolHealth {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var h server.Health
			s.get("/healthz", &h)
			if h.Pool != nil && h.Pool.Ready[pythonImage] == 1 {
				return h.Pool
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool not refilled: %+v; log: %s", h.Pool, s.log())
			}
		}
	}
	post := func(taskJSON string) *result.Result {
		t.Helper()
		var res result.Result
		if resp := s.post(taskJSON, &res); resp.StatusCode != 200 {
			t.Fatalf("status %d: %+v", resp.StatusCode, res)
		}
		return &res
	}
	taskA := netTask(in, allowProbePy, "internet.test")
	taskB := netTask(in, allowProbePy, "www.internet.test")

	before := waitPool()
	cold := post(taskA) // another shape than the seed's: cold
	after := waitPool() // now refilled with the allowlist shape
	if after.Hits != before.Hits || after.Misses != before.Misses+1 {
		t.Fatalf("first allowlist run: pool %+v -> %+v; want one miss", before, after)
	}
	pooled := post(taskA)
	afterA := waitPool()
	if afterA.Hits != after.Hits+1 {
		t.Fatalf("second allowlist run: pool %+v -> %+v; want one hit", after, afterA)
	}
	pooledB := post(taskB)
	afterB := waitPool()
	if afterB.Hits != afterA.Hits+1 {
		t.Fatalf("run with another allowlist: pool %+v -> %+v; want one hit", afterA, afterB)
	}
	pooledA := post(taskA)

	for name, c := range map[string]struct {
		res  *result.Result
		want []string
	}{"cold": {cold, onlyInternet}, "pooled": {pooled, onlyInternet}, "pooled B": {pooledB, onlyWWW}, "pooled A again": {pooledA, onlyInternet}} {
		if got := probeLines(t, c.res); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s run saw:\n  %s\nwant:\n  %s", name, strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
		}
	}
	if c, p := decisions(cold.Network), decisions(pooled.Network); !reflect.DeepEqual(c, p) {
		t.Errorf("network section, cold:\n  %+v\npooled:\n  %+v", c, p)
	}
	for _, a := range pooled.Network.Allowed {
		if a.BytesIn == 0 || a.BytesOut == 0 {
			t.Errorf("pooled run's allowed %+v counts no bytes", a)
		}
	}
	if c, p := decisions(pooledA.Network), decisions(pooled.Network); !reflect.DeepEqual(c, p) {
		t.Errorf("network section of the same task after another policy's run:\n  %+v\nbefore:\n  %+v", c, p)
	}
	for _, d := range pooledB.Network.Denied {
		if d.Host == "www.internet.test" {
			t.Errorf("run B (allow www.internet.test) has a denial of it: %+v", pooledB.Network.Denied)
		}
	}

	s.stop()
	assertNoLeaks(t)
	if after := hostLinks(t); after != linksBefore {
		t.Errorf("host links before %d, after %d", linksBefore, after)
	}
}

// TestPoolAllowlistLeavesNothing: in one process, pooled allowlist runs and
// the pool's close leave no network namespace held (no descriptor of one
// open), no veth on the host, no goroutine and nothing on disk.
func TestPoolAllowlistLeavesNothing(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg := netConfig(t, in)
	linksBefore, nsBefore := hostLinks(t), netnsFDs(t)
	goroutinesBefore := goroutines()
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := r.NewPool(map[string]int{pythonImage: 2})
	r.UsePool(pool)
	p := &pooled{t: t, cfg: cfg, r: r, pool: pool}
	taskJSON := netTask(in, allowProbePy, "internet.test")
	if err := pool.Seed(context.Background(), p.plan(taskJSON)); err != nil {
		t.Fatal(err)
	}
	p.waitReady(2)
	if n := netnsFDs(t) - nsBefore; n != 4 {
		t.Errorf("two ready allowlist sandboxes hold %d network namespaces; want 4 (sandbox and gateway each)", n)
	}
	for range 3 {
		got := probeLines(t, p.run(taskJSON, true))
		if !reflect.DeepEqual(got, onlyInternet) {
			t.Errorf("pooled run saw %q", got)
		}
		p.waitReady(2)
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t)
	if n := netnsFDs(t); n != nsBefore {
		t.Errorf("network namespaces held: %d before, %d after", nsBefore, n)
	}
	if after := hostLinks(t); after != linksBefore {
		t.Errorf("host links before %d, after %d", linksBefore, after)
	}
	assertGoroutines(t, goroutinesBefore)
}

// netnsFDs counts this process's descriptors of network namespaces.
func netnsFDs(t *testing.T) int { return len(namespacesHeld(t, "net")) }

// TestNetworkFilesNameNoHostPath: the files a network run's spec mounts in
// (resolv.conf, hosts, and with services the CA and bundle) come from
// tmpfs mounts of their own: the sandbox's mountinfo names no host path,
// such as the state dir, as their source.
func TestNetworkFilesNameNoHostPath(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, _ := serviceConfig(t, in, "libcontainer")
	code := `
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[4] in ("/etc/resolv.conf", "/etc/hosts", "/etc/agentrun-ca") or f[4].startswith("/etc/ssl"):
        print(f[4], f[3])
`
	for name, taskJSON := range map[string]string{
		"allowlist": pyTask(code, map[string]any{"network": map[string]any{"allow": []string{"internet.test"}}}),
		"services":  pyTask(code, map[string]any{"network": map[string]any{"services": []string{"api"}}}),
	} {
		res := runTaskWith(t, cfg, nil, taskJSON)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if res.ExitCode != 0 || len(lines) < 2 {
			t.Fatalf("%s run: exit %d stdout %q stderr %q", name, res.ExitCode, res.Stdout, res.Stderr)
		}
		for _, l := range lines {
			if strings.Contains(l, stateDir) || strings.Contains(l, "/runs/") {
				t.Errorf("%s run: mountinfo names a host path: %s", name, l)
			}
		}
		if name == "services" && !strings.Contains(res.Stdout, "/etc/agentrun-ca") {
			t.Errorf("services run has no CA mount: %q", res.Stdout)
		}
	}
}
