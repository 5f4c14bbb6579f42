package toolbroker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/test/toolprobe"
)

// needRoot skips t without root, or fails it with $AGENTRUN_TEST_ROOT=1.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("AGENTRUN_TEST_ROOT") == "1" {
			t.Fatal("needs root: " + why + " ($AGENTRUN_TEST_ROOT=1)")
		}
		t.Skip("needs root: " + why)
	}
}

// cgroupOf is the cgroup path of pid in the hierarchy of controller (v1),
// or the unified one.
func cgroupOf(t *testing.T, pid int, controller string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 && (cgroup.Unified() && f[0] == "0" || strings.Contains(","+f[1]+",", ","+controller+",")) {
			return f[2]
		}
	}
	t.Fatalf("process %d: no %s cgroup in %s", pid, controller, b)
	return ""
}

func TestRootCgroupAndUser(t *testing.T) {
	needRoot(t, "a stdio server runs as a uid of the pool in a cgroup of its own")
	parent := "/agentrun-test-toolbroker-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() {
		// In every hierarchy the host has (v1 makes it in each), children
		// first: the broker, without a lock dir, leaves the parent. Made
		// before the broker, so that it runs after the broker's Close.
		if cg, err := cgroup.Open(parent); err == nil {
			if err := cg.Remove(); err != nil {
				t.Error(err)
			}
		}
	})
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, CgroupParent: parent})
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, body := call(t, b, "local", "get_ids", `{}`)
	ids := strings.Split(text(t, body), ":")
	uid, _ := strconv.Atoi(ids[0])
	if !inPool(t, uid) || ids[1] != ids[0] {
		t.Errorf("the server runs as %s:%s; want a uid and gid of the pool", ids[0], ids[1])
	}
	server := serverPid(b, "local")
	call(t, b, "local", "fork", `{"setsid": true}`)
	child := childOf(server)
	want := parent + "/tool-r-test-local"
	for _, pid := range []int{server, child} {
		for _, c := range []string{"pids", "memory"} {
			if got := cgroupOf(t, pid, c); got != want {
				t.Errorf("process %d: %s cgroup %s; want %s", pid, c, got, want)
			}
		}
	}
	limits := map[string]string{"pids/pids.max": "64", "memory/memory.limit_in_bytes": strconv.Itoa(ServerMemory)}
	if cgroup.Unified() {
		limits = map[string]string{"pids.max": "64", "memory.max": strconv.Itoa(ServerMemory)}
	}
	for f, v := range limits {
		if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", filepath.Dir(f), want, filepath.Base(f))); err != nil || strings.TrimSpace(string(b)) != v {
			t.Errorf("%s = %q, %v; want %s", f, b, err, v)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(server) || !gone(child) {
		t.Errorf("after Close: server %d or its child %d in a session of its own left", server, child)
	}
	for _, c := range []string{"pids", "memory"} {
		d := filepath.Join("/sys/fs/cgroup", c, want)
		if cgroup.Unified() {
			d = filepath.Join("/sys/fs/cgroup", want)
		}
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left after Close: %v", d, err)
		}
	}
}

// probeServer is toolprobe's hostile server, named name, with env.
func probeServer(t *testing.T, name string, env ...EnvVar) Server {
	s := stdioServer(t, "", append([]EnvVar{{Name: toolprobe.Env, Value: "1"}}, env...)...)
	s.Name, s.Env = name, s.Env[1:] // no serverEnv: TestMain serves the probe
	s.Rules = []Rule{{Tools: []string{"*"}}}
	return s
}

// hostStatus is field of /proc/PID/status of the host's pid.
func hostStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("process %d: no %s in its status", pid, field)
	return ""
}

// TestRootFence: a tool server that tries to reach past its own process
// (toolprobe: an argument-injection bug's attacker) reaches nothing. It
// sees no other process in /proc; the environment (its secret) and the
// memory of another server of the run, named by its host pid, and of
// agentrun itself are not readable; a listener of the host's loopback and
// an HTTP server there that stands for serve (which it sends 14 wrong
// tokens) are not reachable, nor serve's unix socket. It runs with
// no_new_privs, no capability in any set, as a uid and gid of the pool
// that no other server has, and no supplementary group. After Close
// every process is gone and every uid given back (fenceOpts).
func TestRootFence(t *testing.T) {
	needRoot(t, "a stdio server fenced in namespaces of its own, as a uid of the pool")
	const secret = "agentrun-secret-victim-5e1f"
	victim := probeServer(t, "victim", EnvVar{Name: "VICTIM_TOKEN", Value: secret})
	victim.UID, victim.GID = 4321, 4321 // the config's user: its group is the server's one supplementary group
	hostile := probeServer(t, "hostile")
	b := newBroker(t, Options{Servers: []Server{victim, hostile}})
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	victimPid, hostilePid := serverPid(b, "victim"), serverPid(b, "hostile")
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", victimPid))
	if err != nil || !strings.Contains(string(env), secret) {
		t.Fatalf("the victim's environment, as root sees it: %q, %v; want its secret", env, err)
	}

	listener, reached := toolprobe.Trap(t, "tcp", "127.0.0.1:0")
	serve := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
	}))
	defer serve.Close()
	sockDir, err := os.MkdirTemp("/run", "toolbroker-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	os.Chmod(sockDir, 0o755)
	sock, sockReached := toolprobe.Trap(t, "unix", filepath.Join(sockDir, "serve.sock"))
	os.Chmod(sock, 0o777)

	args, _ := json.Marshal(toolprobe.Args{Marker: "agentrun-secret-", Pids: []int{victimPid, os.Getpid()},
		Dial: []string{listener, serve.Listener.Addr().String(), "unix:" + sock}, Guess: []string{serve.URL + "/v1/sessions"}})
	code, body := call(t, b, "hostile", "probe", string(args))
	if code != 200 {
		t.Fatalf("probe: %d %s", code, body)
	}
	var rep toolprobe.Report
	if err := json.Unmarshal([]byte(text(t, body)), &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("the probe's report: %s", text(t, body))
	if len(rep.Others) > 0 {
		t.Errorf("the server sees other processes in /proc: %v", rep.Others)
	}
	if len(rep.Secrets) > 0 {
		t.Errorf("the server read another's secrets: %v", rep.Secrets)
	}
	for pid, got := range rep.Environ {
		if got == "read" {
			t.Errorf("the server read the environment of process %d", pid)
		}
	}
	for pid, got := range rep.Mem {
		if got == "read" {
			t.Errorf("the server read the memory of process %d", pid)
		}
	}
	for addr, got := range rep.Dial {
		if got == "connected" {
			t.Errorf("the server connected to %s", addr)
		}
	}
	for u, got := range rep.Guess {
		if slices.ContainsFunc(got, func(s string) bool { _, err := strconv.Atoi(s); return err == nil }) {
			t.Errorf("the server's wrong tokens reached %s: %v", u, got)
		}
	}
	if n := reached.Load() + sockReached.Load(); n > 0 {
		t.Errorf("the host's listeners were reached %d times", n)
	}
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := rep.Status[f]; strings.Trim(v, "0") != "" || v == "" {
			t.Errorf("%s of the server: %q; want none", f, v)
		}
	}
	if rep.Status["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs of the server: %q; want 1", rep.Status["NoNewPrivs"])
	}
	victimUID, _ := strconv.Atoi(strings.Fields(hostStatus(t, victimPid, "Uid"))[0])
	if g := hostStatus(t, victimPid, "Groups"); g != "4321" {
		t.Errorf("the groups of the server whose user is 4321:4321: %q; want 4321", g)
	}
	if !inPool(t, rep.UID) || rep.GID != rep.UID || len(rep.Groups) > 0 || rep.UID == victimUID || !inPool(t, victimUID) {
		t.Errorf("the server runs as %d:%d %v, the other server as %d; want ids of the pool of their own, no group", rep.UID, rep.GID, rep.Groups, victimUID)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(victimPid) || !gone(hostilePid) {
		t.Errorf("after Close: server %d or %d left", victimPid, hostilePid)
	}
}
