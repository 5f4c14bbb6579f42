package integration

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"golang.org/x/sys/unix"
)

// e2bDomain is the suite's e2b.domain: its names reach serve only by
// the Host a test sends.
const e2bDomain = "e2b.agentrun.test"

// e2bServe is a serve with an E2B door: its base URL for the SDKs and
// its keys, by user.
type e2bServe struct {
	*served
	keys map[string]string
}

// startE2B starts serve on loopback TCP with an e2b section: templates
// base and code-interpreter-v1 are the python image; one key per user
// of users, each in a root-only file. extra is merged into the config.
func startE2B(t *testing.T, users []string, extra map[string]any) *e2bServe {
	t.Helper()
	dir := t.TempDir()
	keys := map[string]string{}
	keyFiles := map[string]any{}
	for _, u := range users {
		b := make([]byte, 20)
		rand.Read(b)
		keys[u] = "e2b_" + hex.EncodeToString(b)
		p := filepath.Join(dir, u+".key")
		if err := os.WriteFile(p, []byte(keys[u]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		keyFiles[u] = map[string]any{"file": p}
	}
	cfg := serveConfig(map[string]any{"listen": "tcp://127.0.0.1:0", "token": "not-e2b"},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["e2b"] = map[string]any{
		"templates": map[string]any{"base": pythonImage, "code-interpreter-v1": pythonImage,
			"python-data": "dir:" + filepath.Join(*imagesDir, "python-data", "rootfs")},
		"keys":   keyFiles,
		"domain": e2bDomain,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return &e2bServe{served: startServeWith(t, cfg), keys: keys}
}

// node runs script of test/e2b-client with E2B's variables naming the
// door and key, then args, and decodes the JSON object its last line of
// stdout reports (lib.mjs). A "fatal" entry fails the test.
func (s *e2bServe) node(t *testing.T, key, script string, args ...string) map[string]json.RawMessage {
	t.Helper()
	dir := npmPackages(t, "e2b-client", "e2b")
	cmd := exec.Command("node", append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.base+"/e2b", "E2B_SANDBOX_URL="+s.base+"/e2b",
		"E2B_API_KEY="+key, "E2B_DOMAIN=agentrun.invalid")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var seen map[string]json.RawMessage
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &seen); err != nil || jerr != nil {
		t.Fatalf("node %s: %v %v\nstdout: %s\nstderr: %s\nserve: %s", script, err, jerr, out, stderr.String(), s.log())
	}
	if f, ok := seen["fatal"]; ok {
		t.Fatalf("node %s failed: %s\nserve: %s", script, f, s.log())
	}
	return seen
}

// e2bGot decodes seen[name] into v, failing the test if it is absent.
func e2bGot(t *testing.T, seen map[string]json.RawMessage, name string, v any) {
	t.Helper()
	raw, ok := seen[name]
	if !ok {
		t.Fatalf("the script saw no %q: %v", name, seen)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v: %s", name, err, raw)
	}
}

// e2bErr is what lib.mjs's caught recorded: a value or an error.
type e2bErr struct {
	OK      json.RawMessage
	Error   string
	Message string
}

// TestE2BControl: E2B's SDK creates sandboxes of a template through the
// door, reads one back with its metadata and life, lists them by
// metadata and in pages, sets a timeout (not past the max lifetime),
// connects and runs in it; pause, an unknown template, the whole
// internet and an address range are refused in words; another key's
// user sees, reaches and kills none of them; a wrong key is the SDK's
// AuthenticationError, a missing sandbox its NotFoundError, a forged
// access token is refused; a sandbox killed is gone, and nothing is
// left on the host after kill and serve's stop.
func TestE2BControl(t *testing.T) {
	s := startE2B(t, []string{"alice", "bob"}, nil)
	seen := s.node(t, s.keys["alice"], "control.mjs", s.keys["bob"])
	var info struct {
		SandboxID, TemplateID, State, EnvdVersion string
		Metadata                                  map[string]string
		Life                                      int64
	}
	e2bGot(t, seen, "info", &info)
	if !strings.HasPrefix(info.SandboxID, "sb-") || info.TemplateID != "base" || info.State != "running" ||
		info.Metadata["suite"] != "e2b" || info.Life < 110_000 || info.Life > 121_000 || info.EnvdVersion == "" {
		t.Errorf("getInfo: %+v", info)
	}
	var suite []string
	var pages [][]string
	var paused, setTimeout, otherList, listAfter int
	e2bGot(t, seen, "listSuite", &suite)
	e2bGot(t, seen, "pages", &pages)
	e2bGot(t, seen, "paused", &paused)
	e2bGot(t, seen, "setTimeout", &setTimeout)
	if strings.Join(suite, ",") != "1,2" || len(pages) != 3 || len(pages[0]) != 1 || len(pages[2]) != 1 || paused != 0 {
		t.Errorf("list: by metadata %v, pages %v, paused %d", suite, pages, paused)
	}
	if setTimeout < 290 || setTimeout > 300 {
		t.Errorf("setTimeout(300 s): ends in %d s", setTimeout)
	}
	var connect struct {
		Same bool
		Echo string
	}
	e2bGot(t, seen, "connect", &connect)
	if !connect.Same || connect.Echo != "via-connect\n" {
		t.Errorf("connect: %+v", connect)
	}
	wantErr := func(name, class, words string) { t.Helper(); e2bWantErr(t, seen, name, class, words) }
	wantErr("setTimeoutPastMax", "SandboxError", "sandboxes.max_lifetime")
	wantErr("pause", "SandboxError", "never keeps a sandbox's memory")
	wantErr("badTemplate", "SandboxError", "e2b.templates")
	wantErr("internet", "SandboxError", "allow_internet_access")
	wantErr("cidr", "SandboxError", "address or range")
	e2bGot(t, seen, "otherList", &otherList)
	var otherKill, missingKill bool
	e2bGot(t, seen, "otherKill", &otherKill)
	if otherList != 0 || otherKill {
		t.Errorf("another key listed %d sandboxes, killed one: %v", otherList, otherKill)
	}
	wantErr("otherGet", "SandboxNotFoundError", "not found")
	wantErr("otherConnect", "SandboxNotFoundError", "not found")
	wantErr("otherTimeout", "SandboxNotFoundError", "not found")
	wantErr("wrongKey", "AuthenticationError", "Invalid API key")
	wantErr("wrongKeyList", "AuthenticationError", "Invalid API key")
	wantErr("missingGet", "SandboxNotFoundError", "not found")
	wantErr("missingConnect", "SandboxNotFoundError", "not found")
	e2bGot(t, seen, "missingKill", &missingKill)
	if missingKill {
		t.Error("kill of a missing sandbox answered true")
	}
	wantErr("forgedToken", "AuthenticationError", "unauthenticated")
	var killed string
	e2bGot(t, seen, "killed", &killed)
	if killed != "SandboxNotFoundError" {
		t.Errorf("getInfo after kill: %s", killed)
	}
	var afterKill e2bErr
	e2bGot(t, seen, "afterKill", &afterKill)
	if afterKill.Error == "" {
		t.Errorf("a command after kill ran: %s", afterKill.OK)
	}
	e2bGot(t, seen, "listAfter", &listAfter)
	if listAfter != 0 {
		t.Errorf("%d sandboxes listed after every one was killed", listAfter)
	}
	assertNoLeaks(t) // killed: gone before kill answered
	s.stop()
	assertNoLeaks(t)
}

// e2bWantErr fails the test unless seen[name] is an error of class
// whose message holds words.
func e2bWantErr(t *testing.T, seen map[string]json.RawMessage, name, class, words string) {
	t.Helper()
	var e e2bErr
	e2bGot(t, seen, name, &e)
	if e.Error != class || !strings.Contains(e.Message, words) {
		t.Errorf("%s: want %s with %q, got %s %q (ok %s)", name, class, words, e.Error, e.Message, e.OK)
	}
}

// TestE2BCoverage: the SDK calls the other E2B tests leave out
// (coverage.mjs): past sandboxes.max a create is the SDK's
// RateLimitError; user root runs as the sandbox's uid; a disconnected
// command goes on; a handle's stdin, close and kill; pty.connect sees the
// terminal's output and pty.kill ends it; files.writeFiles; runCode's
// onResult; the static getInfo, getFullInfo, setTimeout and kill of one's
// own sandbox and the instance's connect; getMcpToken's file out of reach;
// snapshots, fork, pause, updateNetwork and metrics refused
// saying why, deleteSnapshot false (there are none);
// nothing is left after kill.
func TestE2BCoverage(t *testing.T) {
	s := startE2B(t, []string{"alice"}, map[string]any{"sandboxes": map[string]any{"max": 1}})
	seen := s.node(t, s.keys["alice"], "coverage.mjs")
	e2bWantErr(t, seen, "overMax", "RateLimitError", "sandboxes.max")
	var uids struct{ Default, Root string }
	e2bGot(t, seen, "uids", &uids)
	if uid, err := strconv.ParseInt(uids.Root, 10, 64); err != nil || uid == 0 || uids.Root != uids.Default || !scope.HasUID(uid) {
		t.Errorf("user root: id -u %q, by default %q: not the sandbox's uid", uids.Root, uids.Default)
	}
	var afterDisconnect, killBg, ptyKill, ptyListed bool
	e2bGot(t, seen, "afterDisconnect", &afterDisconnect)
	e2bGot(t, seen, "killBg", &killBg)
	e2bGot(t, seen, "ptyKill", &ptyKill)
	e2bGot(t, seen, "ptyListed", &ptyListed)
	if !afterDisconnect || !killBg || !ptyKill || ptyListed {
		t.Errorf("running after disconnect %v, then killed %v; pty.kill %v, the terminal listed after %v (wait: %s)",
			afterDisconnect, killBg, ptyKill, ptyListed, seen["ptyWait"])
	}
	var handleCat string
	var handleKill bool
	var ptyConnect struct{ Same, Saw bool }
	e2bGot(t, seen, "handleCat", &handleCat)
	e2bGot(t, seen, "handleKill", &handleKill)
	e2bGot(t, seen, "ptyConnect", &ptyConnect)
	if handleCat != "via-handle\n" || !handleKill || !ptyConnect.Same || !ptyConnect.Saw {
		t.Errorf("a handle's stdin: %q, its kill %v; pty.connect %+v", handleCat, handleKill, ptyConnect)
	}
	var wf struct {
		Paths []string
		A, B  string
	}
	e2bGot(t, seen, "writeFiles", &wf)
	if strings.Join(wf.Paths, " ") != "/workspace/wf/a.txt /tmp/wf-b.txt" || wf.A != "A" || wf.B != "BB" {
		t.Errorf("writeFiles: %+v", wf)
	}
	var onResult struct {
		Streamed []struct {
			Text string
			Main bool
		}
		Text string
	}
	e2bGot(t, seen, "onResult", &onResult)
	if len(onResult.Streamed) != 1 || onResult.Streamed[0].Text != "42" || !onResult.Streamed[0].Main || onResult.Text != "42" {
		t.Errorf("runCode's onResult: %+v", onResult)
	}
	var info struct {
		Same  bool
		State string
	}
	e2bGot(t, seen, "staticInfo", &info)
	if !info.Same || info.State != "running" {
		t.Errorf("Sandbox.getInfo: %+v", info)
	}
	var full e2bErr
	e2bGot(t, seen, "fullInfo", &full)
	if string(full.OK) != `{"same":true,"state":"running"}` {
		t.Errorf("Sandbox.getFullInfo: %+v", full)
	}
	var instanceConnect bool
	e2bGot(t, seen, "instanceConnect", &instanceConnect)
	if !instanceConnect {
		t.Error("sandbox.connect() answered another sandbox")
	}
	e2bWantErr(t, seen, "mcpToken", "InvalidArgumentError", "/workspace")
	var staticTimeout int
	var deleteSnapshot bool
	e2bGot(t, seen, "staticTimeout", &staticTimeout)
	e2bGot(t, seen, "deleteSnapshot", &deleteSnapshot)
	if staticTimeout < 150 || staticTimeout > 200 || deleteSnapshot {
		t.Errorf("Sandbox.setTimeout(id, 200 s): %d s left; deleteSnapshot of none: %v", staticTimeout, deleteSnapshot)
	}
	for _, name := range []string{"createSnapshot", "listSnapshots", "fork", "betaPause"} {
		e2bWantErr(t, seen, name, "SandboxError", "never keeps a sandbox's memory")
	}
	e2bWantErr(t, seen, "updateNetwork", "SandboxError", "never changes it")
	e2bWantErr(t, seen, "metrics", "SandboxError", "metrics")
	var staticKill, killAgain bool
	var afterKill string
	e2bGot(t, seen, "staticKill", &staticKill)
	e2bGot(t, seen, "afterKill", &afterKill)
	e2bGot(t, seen, "killAgain", &killAgain)
	if !staticKill || afterKill != "SandboxNotFoundError" || killAgain {
		t.Errorf("Sandbox.kill(id): %v, then getInfo %s, a second kill %v", staticKill, afterKill, killAgain)
	}
	assertNoLeaks(t)
	s.stop()
	assertNoLeaks(t)
}

// TestE2BCommands: through the SDK's commands and pty, processes run in
// the sandbox as its uid: output and exit codes, a failing command as
// CommandExitError, env and cwd, a command past its timeoutMs killed, a background process fed its stdin,
// listed, connected to and killed, stdin closed, a terminal that takes
// input and a resize; nothing is left after kill and serve's stop.
func TestE2BCommands(t *testing.T) { eachRuntime(t, testE2BCommands) }

func testE2BCommands(t *testing.T, rt string) {
	s := startE2B(t, []string{"alice"}, map[string]any{"runtime": rt})
	seen := s.node(t, s.keys["alice"], "commands.mjs")
	var kernel string
	e2bGot(t, seen, "kernel", &kernel)
	if hostRelease := hostKernelRelease(t); (rt == config.RuntimeRunsc) != (kernel != hostRelease) ||
		rt == config.RuntimeRunsc && !strings.Contains(kernel, "gvisor") {
		t.Errorf("uname -r in a %s sandbox: %q (the host's: %q)", rt, kernel, hostRelease)
	}
	var run struct {
		Stdout, Stderr string
		ExitCode       int
	}
	e2bGot(t, seen, "run", &run)
	lines := strings.Split(strings.TrimSpace(run.Stdout), "\n")
	if len(lines) != 4 || lines[0] != "out" || lines[2] != "c1 r1" || lines[3] != "/tmp" || run.Stderr != "err\n" || run.ExitCode != 0 {
		t.Errorf("commands.run: %+v", run)
	} else if uid, err := strconv.ParseInt(lines[1], 10, 64); err != nil || uid == 0 || !scope.HasUID(uid) {
		t.Errorf("id -u: %q: not one of the sandboxes' uids", lines[1])
	}
	var streamed string
	e2bGot(t, seen, "streamed", &streamed)
	if streamed != "ab" {
		t.Errorf("onStdout saw %q", streamed)
	}
	var failed struct {
		IsCommandExitError bool
		ExitCode           int
		Stderr             string
	}
	e2bGot(t, seen, "failedDetail", &failed)
	if !failed.IsCommandExitError || failed.ExitCode != 3 || failed.Stderr != "bad\n" {
		t.Errorf("a failing command: %+v", failed)
	}
	var bgOut string
	var listed, killed, listedAfter, killMissing bool
	var connectedPid int
	e2bGot(t, seen, "bgOut", &bgOut)
	e2bGot(t, seen, "listed", &listed)
	e2bGot(t, seen, "connectedPid", &connectedPid)
	e2bGot(t, seen, "killed", &killed)
	e2bGot(t, seen, "listedAfterKill", &listedAfter)
	e2bGot(t, seen, "killMissing", &killMissing)
	if bgOut != "got:hello\n" || !listed || connectedPid <= 0 || !killed || listedAfter || killMissing {
		t.Errorf("background: out %q, listed %v, connected %d, killed %v, listed after %v, kill of none %v",
			bgOut, listed, connectedPid, killed, listedAfter, killMissing)
	}
	var timedOut e2bErr
	var timedOutGone bool
	e2bGot(t, seen, "timedOut", &timedOut)
	e2bGot(t, seen, "timedOutGone", &timedOutGone)
	if timedOut.Error == "" || !timedOutGone {
		t.Errorf("a command past its timeoutMs: %+v, killed %v", timedOut, timedOutGone)
	}
	var cat struct {
		Stdout   string
		ExitCode int
	}
	e2bGot(t, seen, "cat", &cat)
	if cat.Stdout != "to-cat\n" || cat.ExitCode != 0 {
		t.Errorf("closeStdin: %+v", cat)
	}
	var pty struct{ Out, Answer bool }
	e2bGot(t, seen, "pty", &pty)
	if !pty.Out || !pty.Answer {
		t.Errorf("pty: %+v (%s)", pty, seen["ptyWait"])
	}
	s.stop()
	assertNoLeaks(t)
}

// hostKernelRelease is the host's uname -r.
func hostKernelRelease(t *testing.T) string {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// TestE2BExpiry: a sandbox past its timeout ends: the SDK's getInfo is
// SandboxNotFoundError, a command into it fails, isRunning is false,
// and nothing of it is left on the host while serve still runs.
func TestE2BExpiry(t *testing.T) {
	s := startE2B(t, []string{"alice"}, nil)
	seen := s.node(t, s.keys["alice"], "expiry.mjs")
	var ran, gone string
	var running bool
	var after e2bErr
	e2bGot(t, seen, "ran", &ran)
	e2bGot(t, seen, "gone", &gone)
	e2bGot(t, seen, "after", &after)
	e2bGot(t, seen, "running", &running)
	if ran != "before\n" || gone != "SandboxNotFoundError" || after.Error == "" || running {
		t.Errorf("expiry: ran %q, then getInfo %q, a command %+v, isRunning %v", ran, gone, after, running)
	}
	assertNoLeaks(t)
	s.stop()
}

// TestE2BPorts: a server listening inside a sandbox is reached through
// the door by E2B's headers and the sandbox's traffic token, and only
// with it: no token, another sandbox's, or the envd token is 401; by
// name (e2b.domain) too. A sandbox left running ends with serve's stop,
// leaving nothing.
func TestE2BPorts(t *testing.T) { eachRuntime(t, testE2BPorts) }

func testE2BPorts(t *testing.T, rt string) {
	s := startE2B(t, []string{"alice"}, map[string]any{"runtime": rt})
	seen := s.node(t, s.keys["alice"], "ports.mjs")
	var with struct {
		Status int
		Body   string
	}
	var none, others, envd int
	e2bGot(t, seen, "withToken", &with)
	e2bGot(t, seen, "noToken", &none)
	e2bGot(t, seen, "othersToken", &others)
	e2bGot(t, seen, "envdToken", &envd)
	if with.Status != 200 || with.Body != "served-from-inside\n" || none != 401 || others != 401 || envd != 401 {
		t.Errorf("a sandbox's port: with its token %+v; no token %d, another's %d, the envd token %d", with, none, others, envd)
	}
	var host string
	var byName struct {
		Status int
		Body   string
	}
	var byNameNone, envdByName int
	e2bGot(t, seen, "envdByName", &envdByName)
	e2bGot(t, seen, "getHost", &host)
	e2bGot(t, seen, "byName", &byName)
	e2bGot(t, seen, "byNameNoToken", &byNameNone)
	if !strings.HasPrefix(host, "8000-sb-") || !strings.HasSuffix(host, "."+e2bDomain) ||
		byName.Status != 200 || byName.Body != "served-from-inside\n" || byNameNone != 401 || envdByName != 204 {
		t.Errorf("by name: getHost %q; with the token %+v, without %d; envd's /health %d", host, byName, byNameNone, envdByName)
	}
	s.stop()
	assertNoLeaks(t)
}
