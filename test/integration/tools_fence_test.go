package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/uidpool"
	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/toolprobe"
)

// serversDir is a fresh directory every user may read, for a stdio tool
// server's files: outside /tmp and /run, which a tool server has its own
// of (toolbroker's fence). The test removes it.
func serversDir(t *testing.T) string {
	t.Helper()
	return readableDir(t, "/var/lib", "agentrun-test-tools-")
}

// probeBinary is a copy of this test binary that every user may run: with
// toolprobe.Env set it is toolprobe's hostile server (TestMain).
func probeBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(serversDir(t), "toolprobe")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// inRunUIDs reports whether uid is one of the suite's run_uids.
func inRunUIDs(uid int) bool { return scope.HasUID(int64(uid)) }

// fenceProgram starts server victim (its probe, with nothing to try),
// lets hostile and netted try everything (PROBE_ARGS and NETTED_ARGS),
// prints their reports, and makes the call of victim that the test holds.
const fenceProgram = `
import json, os
import agentrun_tools as t
t.call("victim", "probe")
print("hostile " + t.call("hostile", "probe", **json.loads(os.environ["PROBE_ARGS"])))
print("netted " + t.call("netted", "probe", **json.loads(os.environ["NETTED_ARGS"])))
print("held " + t.call("victim", "whoami"))
`

// TestToolServersFenced: three stdio tool servers of one run are
// toolprobe's hostile server, standing for servers with an
// argument-injection bug. One (victim) holds a secret in its
// environment. hostile, with no allow, sees no other process in /proc,
// reads neither the environment nor the memory of any process (the
// victim's, agentrun's), reaches neither serve's TCP port (14 wrong tokens
// sent there) nor a listener of the host's loopback; netted, whose allow
// names internet.test, reaches internet.test through its own proxy and
// nothing of the host either. Each runs with no_new_privs and no
// capability in any set, as a uid of run_uids reserved for it alone:
// none is another server's or the sandbox's. The operator's right token
// is served by serve afterwards (not 429), and nothing is left.
func TestToolServersFenced(t *testing.T) {
	probe := probeBinary(t)
	in := proxytest.NewInternet(t)
	in.Mux.HandleFunc("/fence", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") })
	secretFile, secret := rootSecret(t)
	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "fence-t0k"})
	serveAddr := strings.TrimPrefix(s.base, "http://")
	listener, reached := toolprobe.Trap(t, "tcp", "127.0.0.1:0")

	server := func(allow []string, env map[string]config.ToolValue, rules ...config.ToolRule) config.ToolServer {
		e := map[string]config.ToolValue{toolprobe.Env: {Value: "1"}}
		for k, v := range env {
			e[k] = v
		}
		return config.ToolServer{Command: []string{probe}, Env: e, Allow: allow, Rules: rules}
	}
	all := config.ToolRule{Tools: []string{"*"}}
	cfg := netConfig(t, in)
	cfg.Tools = config.Tools{
		"victim":  server(nil, map[string]config.ToolValue{"VICTIM_TOKEN": {File: secretFile}}, config.ToolRule{Tools: []string{"probe"}}, config.ToolRule{Tools: []string{"whoami"}, Approve: true}),
		"hostile": server(nil, nil, all),
		"netted":  server([]string{"internet.test"}, nil, all),
	}
	guess := []string{s.base + "/metrics"}
	dial := []string{serveAddr, listener}
	probeArgs, _ := json.Marshal(toolprobe.Args{Marker: secretPrefix, Pids: []int{os.Getpid(), s.cmd.Process.Pid}, Dial: dial, Guess: guess})
	nettedArgs, _ := json.Marshal(toolprobe.Args{Marker: secretPrefix, Dial: dial, Guess: append(guess, "http://internet.test/fence")})

	var mu sync.Mutex
	var held map[uint32]string // the suite's uid reservations while the call is held
	procUIDs := map[int]int{}  // the probes' processes and their uids, then
	hooks := runapi.Hooks{Approve: func(ctx context.Context, run string, a approvals.Approval) approvals.Decision {
		mu.Lock()
		defer mu.Unlock()
		if r, err := uidpool.Open(cfg.RunUIDs.ReservationsDir(), cfg.RunUIDs.First, cfg.RunUIDs.Count); err == nil {
			held, _ = r.Held()
		}
		for pid, uid := range serverProcs(probe) {
			procUIDs[pid] = uid
		}
		return approvals.Decision{Taken: true, Approved: true, By: "test"}
	}}
	res := toolsRun(t, cfg, "", hooks, toolsPyTask(fenceProgram, []string{"victim", "hostile", "netted"},
		map[string]any{"env": map[string]string{"PROBE_ARGS": string(probeArgs), "NETTED_ARGS": string(nettedArgs)}}))
	reports := map[string]toolprobe.Report{}
	for _, l := range strings.Split(res.Stdout, "\n") {
		name, j, ok := strings.Cut(l, " ")
		if !ok || name == "held" {
			continue
		}
		var rep toolprobe.Report
		if err := json.Unmarshal([]byte(j), &rep); err != nil {
			t.Fatalf("%s's report: %v: %s", name, err, j)
		}
		reports[name] = rep
	}
	if len(reports) != 2 || !strings.Contains(res.Stdout, "\nheld ") {
		t.Fatalf("stdout %q, stderr %q; want both reports and the held call's answer", res.Stdout, res.Stderr)
	}
	t.Logf("stdout: %s", res.Stdout)

	for name, rep := range reports {
		if len(rep.Others) > 0 {
			t.Errorf("%s sees other processes in /proc: %v", name, rep.Others)
		}
		if len(rep.Secrets) > 0 || strings.Contains(res.Stdout, secret) {
			t.Errorf("%s read the victim's secret: %v", name, rep.Secrets)
		}
		for pid, got := range rep.Environ {
			if got == "read" || rep.Mem[pid] == "read" {
				t.Errorf("%s read process %d: environment %q, memory %q", name, pid, got, rep.Mem[pid])
			}
		}
		for addr, got := range rep.Dial {
			if got == "connected" {
				t.Errorf("%s connected to %s", name, addr)
			}
		}
		if got := rep.Guess[guess[0]]; slices.ContainsFunc(got, func(s string) bool { _, err := strconv.Atoi(s); return err == nil }) {
			t.Errorf("%s's wrong tokens reached serve: %v", name, got)
		}
		for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if v := rep.Status[f]; v == "" || strings.Trim(v, "0") != "" {
				t.Errorf("%s's %s: %q; want none", name, f, v)
			}
		}
		if rep.Status["NoNewPrivs"] != "1" {
			t.Errorf("%s's NoNewPrivs: %q; want 1", name, rep.Status["NoNewPrivs"])
		}
		if !inRunUIDs(rep.UID) || rep.GID != rep.UID || len(rep.Groups) > 0 {
			t.Errorf("%s runs as %d:%d %v; want a uid and gid of run_uids and no group", name, rep.UID, rep.GID, rep.Groups)
		}
	}
	if got := reports["netted"].Guess["http://internet.test/fence"]; len(got) != toolprobe.Guesses || slices.ContainsFunc(got, func(s string) bool { return s != "200" }) {
		t.Errorf("netted's requests to internet.test, its allow: %v; want all 200", got)
	}
	if n := reached.Load(); n > 0 {
		t.Errorf("the host's loopback listener was reached %d times", n)
	}
	if resp, body := s.do("GET", "/metrics", ""); resp.StatusCode != 200 {
		t.Errorf("the operator after the tool servers' wrong tokens: %d %s", resp.StatusCode, body)
	}

	mu.Lock()
	defer mu.Unlock()
	// The run's dir owns the sandbox's uid; each of its tool servers owns
	// one as the run's dir, then "/tool-" and its name.
	runDir, sandboxUID := "", -1
	for _, owner := range held {
		if strings.HasPrefix(filepath.Base(owner), "tool-") && filepath.Dir(filepath.Dir(owner)) == filepath.Join(stateDir, "runs") {
			runDir = filepath.Dir(owner)
		}
	}
	for id, owner := range held {
		if owner == runDir {
			sandboxUID = int(id)
		}
	}
	if len(procUIDs) != 3 || runDir == "" || sandboxUID < 0 {
		t.Fatalf("while the call was held: server processes %v, reservations %v; want 3 servers and the run's sandbox", procUIDs, held)
	}
	seen := map[int]bool{}
	for pid, uid := range procUIDs {
		owner := held[uint32(uid)]
		if seen[uid] || uid == sandboxUID || !strings.HasPrefix(owner, runDir+"/tool-") {
			t.Errorf("tool server process %d runs as %d, reserved for %q (the sandbox's: %d); want a uid reserved for it alone", pid, uid, owner, sandboxUID)
		}
		seen[uid] = true
	}
	assertToolsClean(t, cfg, probe)
}
