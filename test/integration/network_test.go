package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/proxy"
	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// netConfig names the fake internet host and three rebinding traps, and
// opens the 198.18.0.0/15 range the fake host lives in.
func netConfig(t testing.TB, in *proxytest.Internet) *config.Config {
	cfg := testConfig(t)
	cfg.Network.Hosts = map[string]netip.Addr{
		"internet.test": in.IP, "www.internet.test": in.IP, "loop.test": netip.MustParseAddr("127.0.0.1"),
		"private.test": netip.MustParseAddr("10.0.0.1"), "metadata.test": netip.MustParseAddr("169.254.169.254"),
	}
	cfg.Network.AllowRanges = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	return cfg
}

// netConfigFor is netConfig with rt as the default runtime.
func netConfigFor(t *testing.T, in *proxytest.Internet, rt string) *config.Config {
	cfg := netConfig(t, in)
	cfg.Runtime = rt
	return cfg
}

// netTask is a python task that trusts the fake host's CA.
func netTask(in *proxytest.Internet, code string, allow ...string) string {
	b, _ := json.Marshal(map[string]any{
		"code":    code,
		"files":   map[string]any{"ca.pem": map[string]string{"content": string(in.CAPEM)}},
		"env":     map[string]string{"SSL_CERT_FILE": "/workspace/ca.pem"},
		"network": map[string]any{"allow": allow},
		"limits":  map[string]any{"timeout": "20s"},
	})
	return string(b)
}

const fetchPy = `
import sys, urllib.request, urllib.error, socket, os
def fetch(url, proxies=True):
    opener = urllib.request.build_opener() if proxies else urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        r = opener.open(url, timeout=10)
        return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip())
    except urllib.error.URLError as e:
        return "URLError %s" % e.reason
    except Exception as e:
        return "ERR %s" % type(e).__name__
def resolve(name):
    try:
        return socket.gethostbyname(name)
    except socket.gaierror as e:
        return "NXDOMAIN" if e.errno == socket.EAI_NONAME else "ERR %s" % e
`

func TestAllowlistExplicitAndTransparent(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		code := fetchPy + `
print(fetch("https://internet.test/hello"))
print(fetch("http://www.internet.test/hello"))
print(fetch("https://internet.test/hello", proxies=False))
print(fetch("http://www.internet.test/hello", proxies=False))
print(resolve("internet.test") == os.environ["HTTP_PROXY"].split("//")[1].split(":")[0])
`
		res := runTaskWith(t, netConfigFor(t, in, rt), nil, netTask(in, code, "internet.test", "*.internet.test"))
		want := "200 hello from internet.test over https\n200 hello from www.internet.test over http\n" +
			"200 hello from internet.test over https\n200 hello from www.internet.test over http\nTrue\n"
		if res.Stdout != want {
			t.Fatalf("stdout:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
		}
		hosts := map[string]bool{}
		for _, a := range res.Network.Allowed {
			hosts[fmt.Sprintf("%s:%d", a.Host, a.Port)] = a.BytesIn > 0 && a.BytesOut > 0
		}
		for _, hp := range []string{"internet.test:443", "www.internet.test:80"} {
			if !hosts[hp] {
				t.Errorf("network.allowed lacks %s with byte counts: %+v", hp, res.Network.Allowed)
			}
		}
	})
}

func TestAllowlistWgetThroughProxy(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		cfg := netConfigFor(t, in, rt)
		res := runTaskWith(t, cfg, nil, fmt.Sprintf(`{"image":%q,"command":["wget","-q","-O","-","http://internet.test/hello"],"network":{"allow":["internet.test"]}}`, busyboxImage))
		if res.Stdout != "hello from internet.test over http" || res.ExitCode != 0 {
			t.Fatalf("busybox wget: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
}

func TestAllowlistDenials(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		code := fetchPy + fmt.Sprintf(`
print(fetch("https://evil.example/"))
print(resolve("evil.example"))
print(fetch("http://%[1]s/hello"))
print(fetch("https://%[1]s/hello"))
print(fetch("http://loop.test/"))
print(fetch("http://private.test/"))
print(fetch("http://metadata.test/latest/meta-data/"))
def tcp(ip, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((ip, port)); return "connected"
    except OSError as e:
        return type(e).__name__ + " " + (os.strerror(e.errno) if e.errno else "")
print(tcp("%[1]s", 80))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("%[1]s", 9999)); u.settimeout(2); print("udp", u.recv(10))
except OSError as e:
    print("udp", type(e).__name__)
`, in.IP)
		res := runTaskWith(t, netConfigFor(t, in, rt), nil, netTask(in, code, "internet.test", "loop.test", "private.test", "metadata.test"))
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if len(lines) != 9 {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
		check := func(i int, prefix, contains string) {
			t.Helper()
			if !strings.HasPrefix(lines[i], prefix) || !strings.Contains(lines[i], contains) {
				t.Errorf("line %d = %q; want %q ... %q", i, lines[i], prefix, contains)
			}
		}
		// HTTPS through the proxy: the CONNECT is refused with a 403.
		check(0, "URLError", "Tunnel connection failed: 403")
		check(1, "NXDOMAIN", "")
		check(2, "403", "ip literal")
		check(3, "URLError", "403")
		check(4, "403", "host's own address 127.0.0.1") // loopback is the host's before it is a range
		for i := 5; i <= 6; i++ {
			check(i, "403", "not globally routable")
		}
		check(7, "OSError", "unreachable")
		check(8, "udp OSError", "")
		denied := map[string]bool{}
		for _, d := range res.Network.Denied {
			denied[d.Host] = true
		}
		for _, h := range []string{"evil.example", in.IP.String(), "loop.test", "private.test", "metadata.test"} {
			if !denied[h] {
				t.Errorf("network.denied lacks %s: %+v", h, res.Network.Denied)
			}
		}
	})
}

// TestAllowedUpstreamFailures reaches for allowed destinations that fail: a
// port where nothing listens, a network.hosts name whose address nothing
// holds, and a name that does not resolve. The program gets a 502 that
// says why; the result and the audit record list each failure.
func TestAllowedUpstreamFailures(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		cfg := netConfigFor(t, in, rt)
		cfg.Network.Hosts["silent.test"] = in.Silent
		auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
		log, err := audit.Open(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		code := fetchPy + `
print(fetch("http://internet.test:81/"))
print(fetch("https://internet.test:81/"))
print(fetch("http://silent.test/"))
print(fetch("http://nosuch.invalid/"))
`
		res := runTaskWith(t, cfg, log, netTask(in, code, "internet.test:81", "silent.test", "nosuch.invalid"))
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if len(lines) != 4 {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
		for i, want := range []string{
			"502 agentrun: egress to internet.test:81 failed: connection refused",
			"URLError Tunnel connection failed: 502 Bad Gateway: connection refused",
			"502 agentrun: egress to silent.test:80 failed: host unreachable",
			"502 agentrun: egress to nosuch.invalid:80 failed: name ",
		} {
			if !strings.HasPrefix(lines[i], want) {
				t.Errorf("line %d = %q; want %q...", i, lines[i], want)
			}
		}
		check := func(where string, failed []result.Failed) {
			t.Helper()
			got := map[string]string{}
			for _, f := range failed {
				got[fmt.Sprintf("%s:%d", f.Host, f.Port)] = f.Reason
			}
			for hp, reason := range map[string]string{
				"internet.test:81": "connection refused", "silent.test:80": "host unreachable", "nosuch.invalid:80": "name ",
			} {
				if reason != "" && !strings.HasPrefix(got[hp], reason) {
					t.Errorf("%s: failure of %s = %q; want %q... (all: %+v)", where, hp, got[hp], reason, failed)
				}
			}
		}
		check("result network.failed", res.Network.Failed)
		b, err := os.ReadFile(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		var rec audit.Record
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatalf("audit record %q: %v", b, err)
		}
		check("audit network.failed", rec.Network.Failed)
		if len(res.Network.Denied) != 0 {
			t.Errorf("failures of allowed hosts recorded as denials: %+v", res.Network.Denied)
		}
	})
}

// TestGatewayFlood has the sandbox open thousands of connections to the
// gateway's proxy, transparent and DNS listeners, each with an unfinished
// 30 KB request head, from 8 processes. agentrun's memory (the runner runs
// in this process) must stay under the proxy's stated ceiling, and a
// normal request must work once the flood ends.
func TestGatewayFlood(t *testing.T) {
	in := proxytest.NewInternet(t)
	code := fetchPy + `
import os, time
gw = os.environ["HTTP_PROXY"].split("//")[1].split(":")[0]
head = b"GET http://internet.test/hello HTTP/1.1\r\nHost: internet.test\r\n" + b"X-A: b\r\n" * 3800
kids = []
for k in range(8):
    pid = os.fork()
    if pid == 0:
        held, socks = 0, []
        for i in range(500):
            port = (3128, 80, 53)[i % 3]
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect((gw, port))
                s.sendall(b"\xff\xff" + head if port == 53 else head)
                held += 1
            except OSError:
                pass
            socks.append(s)
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
for i in range(20):
    r = fetch("http://internet.test/hello")
    if r.startswith("200"):
        break
    time.sleep(0.25)
print(r)
`
	var ms runtime.MemStats
	memInUse := func() uint64 {
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	runtime.GC()
	before := memInUse()
	peak := before
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				peak = max(peak, memInUse())
			}
		}
	})
	cfg := netConfigFor(t, in, "libcontainer")
	task := netTask(in, code, "internet.test")
	res := runTaskWith(t, cfg, nil, task)
	close(done)
	wg.Wait()
	if strings.TrimSpace(res.Stdout) != "200 hello from internet.test over http" {
		t.Errorf("request after the flood: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	plan, err := taskPlan(task, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The stated ceiling, (net_connections + 32) × 128 KiB, and room for
	// the run's own machinery.
	maxClients := int(plan.Limits.NetConns) + 32
	if n := (proxy.Policy{MaxConns: int(plan.Limits.NetConns)}).MaxClients(); n != maxClients {
		t.Errorf("proxy allows %d connections; docs/services.md states %d", n, maxClients)
	}
	ceiling := uint64(maxClients<<17 + 24<<20)
	grew := peak - before
	t.Logf("agentrun's memory in use grew by %d KiB under the flood (ceiling %d KiB for %d connections)", grew>>10, ceiling>>10, maxClients)
	if grew > ceiling {
		t.Errorf("agentrun's memory in use grew by %d MiB under the flood; ceiling %d MiB", grew>>20, ceiling>>20)
	}
	var refused bool
	for _, d := range res.Network.Denied {
		refused = refused || d.Reason == "too many connections to the gateway"
	}
	if !refused {
		t.Errorf("network.denied lacks the refused flood: %+v", res.Network.Denied)
	}
}

func taskPlan(taskJSON string, cfg *config.Config) (*task.Plan, error) {
	return task.Load([]byte(taskJSON), cfg)
}

func TestHostServicesUnreachable(t *testing.T) {
	in := proxytest.NewInternet(t)
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host secret"))
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	abstract := fmt.Sprintf("agentrun-test-%d", time.Now().UnixNano())
	ul, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	// Control: the host itself reaches both.
	for _, a := range [][2]string{{"tcp4", fmt.Sprintf("127.0.0.1:%d", port)}, {"unix", "@" + abstract}} {
		c, err := net.Dial(a[0], a[1])
		if err != nil {
			t.Fatalf("control: host cannot reach its own %s: %v", a[1], err)
		}
		c.Close()
	}
	var hostIPs []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			hostIPs = append(hostIPs, ipn.IP.String())
		}
	}
	code := fmt.Sprintf(`
import socket, os, json
gw = os.environ.get("HTTP_PROXY", "http://127.0.0.1:1").split("//")[1].split(":")[0]
out = {}
for ip in %s + [gw, "127.0.0.1"]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((ip, %d)); out[ip] = "connected"
    except OSError as e:
        out[ip] = os.strerror(e.errno) if e.errno else type(e).__name__
u = socket.socket(socket.AF_UNIX)
try:
    u.connect("\0%s"); out["abstract"] = "connected"
except OSError as e:
    out["abstract"] = os.strerror(e.errno)
print(json.dumps(out))
`, pyList(hostIPs), port, abstract)
	for _, tc := range []struct{ name, task string }{
		{"no network", pyTask(code, nil)},
		{"allowlist", netTask(in, code, "internet.test")},
	} {
		eachRuntime(t, func(t *testing.T, rt string) {
			t.Run(tc.name, func(t *testing.T) {
				res := runTaskWith(t, netConfigFor(t, in, rt), nil, tc.task)
				var got map[string]string
				if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
					t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
				}
				for k, v := range got {
					if v == "connected" {
						t.Errorf("sandbox reached the host's %s", k)
					}
				}
				if got["abstract"] != "Connection refused" {
					t.Errorf("abstract socket: %q; want Connection refused", got["abstract"])
				}
			})

		})
	}
}

// TestNoNetworkSaysSo: a run with no network at all says so in its
// result's network, whatever its program tried: its lookup and its
// connection fail inside the sandbox, where agentrun sees neither, and
// the result says why. A run with an allowlist does not say so; the CLI's
// JSON and its text summary say so too.
func TestNoNetworkSaysSo(t *testing.T) {
	in := proxytest.NewInternet(t)
	code := fetchPy + fmt.Sprintf(`
print(resolve("internet.test"))
s = socket.socket(); s.settimeout(2)
try:
    s.connect((%q, 80)); print("connected")
except OSError as e:
    print(os.strerror(e.errno) if e.errno else type(e).__name__)
`, in.IP.String())
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := netConfigFor(t, in, rt)
		res := runTaskWith(t, cfg, nil, pyTask(code, nil))
		lookup, connect, _ := strings.Cut(strings.TrimSpace(res.Stdout), "\n")
		if !strings.HasPrefix(lookup, "ERR") || connect == "connected" || connect == "" {
			t.Fatalf("no network: stdout %q stderr %q; want the lookup and the connection to fail", res.Stdout, res.Stderr)
		}
		n := res.Network
		if !n.None || n.Note != result.NoNetworkNote || len(n.Allowed)+len(n.Denied)+len(n.Failed) != 0 {
			t.Errorf("no network: the result's network %+v; want none, with its note, and nothing listed", n)
		}

		res = runTaskWith(t, cfg, nil, netTask(in, code, "internet.test"))
		if strings.HasPrefix(res.Stdout, "ERR") || strings.HasPrefix(res.Stdout, "NXDOMAIN") {
			t.Errorf("allowlist: stdout %q stderr %q; want the lookup answered", res.Stdout, res.Stderr)
		}
		if res.Network.None || res.Network.Note != "" {
			t.Errorf("allowlist: the result's network %+v says it had none", res.Network)
		}
	})

	res, stdout, _, _ := cli(t, pyTask(code, nil), "run", "-")
	var raw struct {
		Network map[string]any `json:"network"`
	}
	if res == nil || json.Unmarshal([]byte(stdout), &raw) != nil || raw.Network["none"] != true || raw.Network["note"] != result.NoNetworkNote {
		t.Errorf("agentrun run: %s; want network.none true and its note", stdout)
	}
	if _, _, stderr, _ := cli(t, pyTask(code, nil), "run", "--format", "text", "-"); !strings.Contains(stderr, ", no network\n") {
		t.Errorf("agentrun run --format text: stderr %q; want the summary to say no network", stderr)
	}
}

func pyList(ss []string) string {
	b, _ := json.Marshal(ss)
	return string(b)
}

// Twenty allowlist runs at once on one runner: each has its own /30 and
// reaches only its own gateway; afterwards no veth, namespace, listener or
// goroutine is left.
func TestTwentyAllowlistRunsAtOnce(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg := netConfig(t, in)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	linksBefore := hostLinks(t)
	goroutinesBefore := goroutines()
	code := fetchPy + `
import socket, json, time
gw = os.environ["HTTP_PROXY"].split("//")[1].split(":")[0]
time.sleep(0.5)
others = {}
base = gw.rsplit(".", 2)[0]
for third in range(0, 2):
    for last in range(1, 100, 4):
        ip = "%s.%d.%d" % (base, third, last)
        if ip == gw: continue
        s = socket.socket(); s.settimeout(1)
        try:
            s.connect((ip, 3128)); others[ip] = "connected"
        except OSError:
            pass
print(json.dumps({"gw": gw, "hello": fetch("https://internet.test/hello"), "others": others}))
`
	taskJSON := netTask(in, code, "internet.test")
	results := make([]*result.Result, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			plan, err := task.Load([]byte(taskJSON), cfg)
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = r.Run(context.Background(), plan, runapi.Hooks{})
		})
	}
	wg.Wait()
	gws := map[string]bool{}
	for i, res := range results {
		if res == nil {
			continue
		}
		var got struct {
			GW     string
			Hello  string
			Others map[string]string
		}
		if res.Error != "" || json.Unmarshal([]byte(res.Stdout), &got) != nil {
			t.Errorf("run %d: error %q stdout %q stderr %q", i, res.Error, res.Stdout, res.Stderr)
			continue
		}
		if got.Hello != "200 hello from internet.test over https" {
			t.Errorf("run %d: %q", i, got.Hello)
		}
		if len(got.Others) > 0 {
			t.Errorf("run %d (gateway %s) reached other runs' gateways: %v", i, got.GW, got.Others)
		}
		if gws[got.GW] {
			t.Errorf("gateway %s given to two runs at once", got.GW)
		}
		gws[got.GW] = true
	}
	assertNoLeaks(t)
	if after := hostLinks(t); after != linksBefore {
		t.Errorf("host links before %d, after %d", linksBefore, after)
	}
	assertGoroutines(t, goroutinesBefore)
	if fds, _ := os.ReadDir("/proc/self/fd"); len(fds) > 64 {
		t.Errorf("%d fds open after the runs", len(fds))
	}
}

// assertGoroutines checks, waiting up to 5 s for them to end, that no more
// goroutines run than before.
// goroutines is this process's goroutine count, with the watch of the
// host's own addresses running: a network's first run starts it
// (hostaddr.Watch), once for the process, so that the first network test
// of a process would otherwise count it as its own leak.
func goroutines() int {
	hostaddr.Watch()
	return runtime.NumGoroutine()
}

func assertGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		var stacks strings.Builder
		pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Errorf("goroutines before %d, after %d:\n%s", before, n, stacks.String())
	}
}

func hostLinks(t *testing.T) int {
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range links {
		if !strings.HasPrefix(l.Attrs().Name, testenv.FixtureLinkPrefix) {
			n++
		}
	}
	return n
}
