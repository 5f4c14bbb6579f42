package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/test/testenv"
)

// newLiveSandbox makes a live sandbox of the busybox image on r with
// runtime rt, closed when the test ends.
func newLiveSandbox(t *testing.T, r *runner.Runner, rt string, opt sandbox.Options) *sandbox.Sandbox {
	t.Helper()
	cfg := cfgFor(t, rt)
	plan, err := task.Load([]byte(`{"image": "`+busyboxImage+`", "command": ["true"]}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.Create(context.Background(), r, plan, "alice", opt)
	if err != nil {
		t.Fatalf("creating a live sandbox: %v", err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb
}

// liveExec runs req in sb to its end and returns its stdout (or what its
// terminal printed), stderr and exit event.
func liveExec(t *testing.T, sb *sandbox.Sandbox, req sandbox.ExecRequest) (string, string, sandbox.Event) {
	t.Helper()
	p, err := sb.Exec(req)
	if err != nil {
		t.Fatalf("exec %q%v: %v", req.Cmd, req.Command, err)
	}
	return collect(t, p)
}

func collect(t *testing.T, p *sandbox.Process) (string, string, sandbox.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut strings.Builder
	seq := 0
	for {
		evs, next, done := p.Next(ctx, seq)
		seq = next
		for _, e := range evs {
			switch e.Event {
			case "stdout", "pty":
				out.WriteString(e.Data)
			case "stderr":
				errOut.WriteString(e.Data)
			case "exit":
				return out.String(), errOut.String(), e
			}
		}
		if done || ctx.Err() != nil {
			t.Fatalf("process %d: no exit event (done %v)", p.Pid(), done)
		}
	}
}

// TestLiveSandbox: a live sandbox's processes run as its own uid with no
// capabilities, no_new_privs and the filter; a process in the background
// outlives its request and is seen by later ones; stdin, signals,
// timeouts and files work, the files never through a link; two sandboxes
// see nothing of each other; Close leaves nothing on the host.
func TestLiveSandbox(t *testing.T) {
	for _, helper := range []bool{true, false} {
		t.Run("seccomp-helper="+strconv.FormatBool(helper), func(t *testing.T) {
			cfg := testConfig(t)
			if !helper {
				cfg.SeccompHelper = ""
			}
			r, err := compose.Runner(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			testLiveSandbox(t, r, config.RuntimeLibcontainer)
			assertNoLeaks(t)
		})
	}
	// On gVisor: every process a `runsc exec` into the sandbox.
	t.Run(config.RuntimeRunsc, func(t *testing.T) {
		r, err := compose.Runner(cfgFor(t, config.RuntimeRunsc), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		testLiveSandbox(t, r, config.RuntimeRunsc)
		assertNoLeaks(t)
	})
}

func testLiveSandbox(t *testing.T, r *runner.Runner, rt string) {
	a := newLiveSandbox(t, r, rt, sandbox.Options{Lifetime: 2 * time.Minute})
	b := newLiveSandbox(t, r, rt, sandbox.Options{Lifetime: 2 * time.Minute})
	if a.ID == b.ID || len(a.ID) != len("sb-")+32 {
		t.Errorf("ids %q and %q", a.ID, b.ID)
	}

	out, _, exit := liveExec(t, a, sandbox.ExecRequest{Command: []string{"id", "-u"}})
	uid, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || *exit.ExitCode != 0 {
		t.Fatalf("id -u: %q, exit %+v", out, exit)
	}
	if uid == 0 || !scope.HasUID(uid) {
		t.Errorf("an exec'd process runs as uid %d, not one of the sandbox uids", uid)
	}

	status, _, _ := liveExec(t, a, sandbox.ExecRequest{Cmd: "cat /proc/self/status"})
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000",
		"CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000"} {
		if !strings.Contains(status, want+"\n") {
			t.Errorf("an exec'd process's status lacks %q:\n%s", want, status)
		}
	}
	// The filter is the sandbox's: as many filters as its init has.
	// gVisor's status has no Seccomp_filters line: on runsc the escape
	// battery's runsc-live proves the filter by what it refuses.
	initStatus, _, _ := liveExec(t, a, sandbox.ExecRequest{Cmd: "cat /proc/1/status"})
	if f, g := filters(status), filters(initStatus); rt != config.RuntimeRunsc && (f == "" || f != g) {
		t.Errorf("an exec'd process has %q seccomp filters, the sandbox's init %q", f, g)
	}

	// A process with a terminal is the same exec: the same uid,
	// no_new_privs, no capabilities and the same filter. Its terminal
	// is the sandbox's devpts on libcontainer; on gVisor a host one
	// that gVisor's kernel mediates, which ttyname does not name.
	ttyStatus, _, _ := liveExec(t, a, sandbox.ExecRequest{Cmd: "tty; test -t 0 && test -t 1 && test -t 2 && echo all-tty; id -u; cat /proc/self/status", TTY: &runapi.TTYSize{Rows: 24, Cols: 80}})
	ttyStatus = strings.ReplaceAll(ttyStatus, "\r\n", "\n")
	if rt != config.RuntimeRunsc && !strings.HasPrefix(ttyStatus, "/dev/pts/") ||
		!strings.Contains(ttyStatus, "\nall-tty\n"+strings.TrimSpace(out)+"\n") {
		t.Errorf("a tty process's tty and uid (want %s): %q", strings.TrimSpace(out), ttyStatus)
	}
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000"} {
		if !strings.Contains(ttyStatus, want+"\n") {
			t.Errorf("a tty process's status lacks %q:\n%s", want, ttyStatus)
		}
	}
	if f, g := filters(ttyStatus), filters(initStatus); f != g {
		t.Errorf("a tty process has %q seccomp filters, the sandbox's init %q", f, g)
	}

	// A process in the background outlives its request.
	bg, err := a.Exec(sandbox.ExecRequest{Cmd: "echo up > /workspace/bg; while :; do sleep 1; done # marker-a"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, _ := liveExec(t, a, sandbox.ExecRequest{Command: []string{"cat", "/workspace/bg"}})
		if out == "up\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background process's file never appeared")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if i := slices.IndexFunc(a.Processes(), func(in sandbox.Info) bool { return in.Pid == bg.Pid() }); i < 0 || !a.Processes()[i].Running {
		t.Errorf("the background process is not listed as running: %+v", a.Processes())
	}
	ps, _, _ := liveExec(t, a, sandbox.ExecRequest{Cmd: "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"})
	if !strings.Contains(ps, "marker-a") {
		t.Errorf("a later process does not see the background one: %q", ps)
	}
	// The other sandbox sees neither its process nor its files.
	psB, _, _ := liveExec(t, b, sandbox.ExecRequest{Cmd: "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; cat /workspace/bg"})
	if strings.Contains(psB, "marker-a") || strings.Contains(psB, "up") {
		t.Errorf("sandbox b sees a's process or files: %q", psB)
	}
	if err := bg.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _, exit = collect(t, bg)
	if exit.Signal != "SIGTERM" {
		t.Errorf("the signalled process's exit: %+v", exit)
	}

	// stdin, kept open, round trip.
	cat, err := a.Exec(sandbox.ExecRequest{Command: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.WriteStdin([]byte("ping\n"), false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	evs, _, _ := cat.Next(ctx, 1)
	cancel()
	if len(evs) == 0 || evs[0].Data != "ping\n" {
		t.Errorf("cat's echo before stdin closed: %+v", evs)
	}
	if err := cat.WriteStdin(nil, true); err != nil {
		t.Fatal(err)
	}
	if _, _, exit := collect(t, cat); *exit.ExitCode != 0 {
		t.Errorf("cat after stdin closed: %+v", exit)
	}

	// A process's timeout kills it alone.
	_, _, exit = liveExec(t, a, sandbox.ExecRequest{Command: []string{"sleep", "60"}, Timeout: time.Second})
	if !exit.TimedOut || exit.Signal != "SIGKILL" {
		t.Errorf("a process past its timeout: %+v", exit)
	}

	// Files, both ways.
	if err := a.WriteFile("dir/f.txt", strings.NewReader("hello"), 5); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := liveExec(t, a, sandbox.ExecRequest{Command: []string{"cat", "dir/f.txt"}}); out != "hello" {
		t.Errorf("the sandbox reads %q of a file put", out)
	}
	liveExec(t, a, sandbox.ExecRequest{Cmd: "printf made > /workspace/dir/g.txt"})
	if got, err := a.ReadFile("/workspace/dir/g.txt", 100); err != nil || string(got) != "made" {
		t.Errorf("reading a file the sandbox made: %q, %v", got, err)
	}
	list, err := a.List("dir")
	if err != nil || len(list) != 2 || list[0].Name != "f.txt" || list[0].Size != 5 || list[0].Type != "file" {
		t.Errorf("list of dir: %+v, %v", list, err)
	}
	if _, err := a.ReadFile("/etc/passwd", 100); !errors.Is(err, sandbox.ErrBadPath) {
		t.Errorf("a path outside /workspace: %v", err)
	}
	if _, err := a.ReadFile("../x", 100); !errors.Is(err, sandbox.ErrBadPath) {
		t.Errorf("a path with ..: %v", err)
	}
	// Links planted in the workspace never lead the host out.
	host := t.TempDir()
	secret := filepath.Join(host, "secret")
	if err := os.WriteFile(secret, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	liveExec(t, a, sandbox.ExecRequest{Command: []string{"ln", "-s", secret, "/workspace/link"}})
	liveExec(t, a, sandbox.ExecRequest{Command: []string{"ln", "-s", host, "/workspace/dlink"}})
	if got, err := a.ReadFile("link", 100); err == nil {
		t.Errorf("a files read through a planted link got %q", got)
	}
	if _, err := a.List("dlink"); err == nil {
		t.Errorf("a list through a planted directory link succeeded")
	}
	if err := a.WriteFile("dlink/new", strings.NewReader("x"), 1); err == nil {
		t.Errorf("a write through a planted directory link succeeded")
	}
	if err := a.WriteFile("link", strings.NewReader("pwned"), 5); err != nil {
		t.Errorf("a write over a planted link: %v", err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host" {
		t.Errorf("the host file the link named holds %q", b)
	}
	if _, err := os.Stat(filepath.Join(host, "new")); err == nil {
		t.Errorf("a write through the directory link made a host file")
	}
	if err := a.Remove("dlink"); err != nil {
		t.Errorf("removing the planted link: %v", err)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Errorf("removing the link removed the host's: %v", err)
	}

	if _, err := a.SetTimeout(2 * time.Hour); err == nil {
		t.Errorf("a timeout past the max lifetime was taken")
	}
	if err := b.Close(); err != nil {
		t.Errorf("closing b: %v", err)
	}
	if leaks := hostLeaksExcept(""); len(leaks) == 0 {
		t.Errorf("a live sandbox left no trace while it lives: the leak check sees nothing")
	}
	if err := a.Close(); err != nil {
		t.Errorf("closing a: %v", err)
	}
	if _, err := a.Exec(sandbox.ExecRequest{Command: []string{"true"}}); !errors.Is(err, sandbox.ErrEnded) {
		t.Errorf("exec in a closed sandbox: %v", err)
	}
}

// TestLiveSandboxExpires: a sandbox ends by itself at its lifetime, its
// processes with it, and leaves nothing on the host.
func TestLiveSandboxExpires(t *testing.T) {
	testenv.RequireRoot(t)
	eachRuntime(t, testLiveSandboxExpires)
}

func testLiveSandboxExpires(t *testing.T, rt string) {
	r, err := compose.Runner(cfgFor(t, rt), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sb := newLiveSandbox(t, r, rt, sandbox.Options{Lifetime: 3 * time.Second})
	p, err := sb.Exec(sandbox.ExecRequest{Cmd: "while :; do sleep 1; done"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	case <-time.After(time.Minute):
		t.Fatal("the sandbox outlived its lifetime")
	}
	select {
	case <-p.Done():
	default:
		t.Error("its process outlived the sandbox")
	}
	assertNoLeaks(t)
}

// filters is the Seccomp_filters line's value of a /proc/PID/status.
func filters(status string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "Seccomp_filters:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
