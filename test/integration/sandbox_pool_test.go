package integration

import (
	"context"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/task"
)

// TestLiveSandboxPooled: a live sandbox create takes a ready sandbox of
// its shape from the pool, and the pool makes the next one; each is as
// locked down as a cold one (its own uid, no capabilities, no_new_privs,
// the filter) and fresh: what one sandbox wrote or left running is not in
// the next, which has another uid; its ports are reached as a cold one's.
func TestLiveSandboxPooled(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := cfgFor(t, rt)
		r, err := compose.Runner(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		plan, err := task.Load([]byte(`{"image": "`+busyboxImage+`", "command": ["true"]}`), cfg)
		if err != nil {
			t.Fatal(err)
		}
		pool := r.NewPool(map[string]int{plan.Image: 1})
		r.UsePool(pool)
		defer func() {
			if err := pool.Close(); err != nil {
				t.Errorf("closing the pool: %v", err)
			}
			assertNoLeaks(t)
		}()
		if err := pool.Seed(context.Background(), sandbox.HolderPlan(plan)); err != nil {
			t.Fatal(err)
		}
		ready := func() {
			t.Helper()
			for deadline := time.Now().Add(time.Minute); pool.Stats().Ready[plan.Image] < 1; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the pool made no sandbox: %+v", pool.Stats())
				}
			}
		}
		create := func(hits int64) *sandbox.Sandbox {
			t.Helper()
			ready()
			sb, err := sandbox.Create(context.Background(), r, plan, "alice", sandbox.Options{Lifetime: 2 * time.Minute})
			if err != nil {
				t.Fatalf("creating a live sandbox: %v", err)
			}
			t.Cleanup(func() { sb.Close() })
			if st := pool.Stats(); st.Hits != hits {
				t.Errorf("the sandbox was not taken from the pool: %+v", st)
			}
			return sb
		}
		uidOf := func(sb *sandbox.Sandbox) int64 {
			t.Helper()
			out, _, _ := liveExec(t, sb, sandbox.ExecRequest{Command: []string{"id", "-u"}})
			uid, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
			if err != nil || uid == 0 || !scope.HasUID(uid) {
				t.Fatalf("id -u in a pooled sandbox: %q: not one of the sandbox uids", out)
			}
			return uid
		}

		a := create(1)
		uidA := uidOf(a)
		status, _, _ := liveExec(t, a, sandbox.ExecRequest{Cmd: "cat /proc/self/status"})
		for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000",
			"CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000"} {
			if !strings.Contains(status, want+"\n") {
				t.Errorf("a pooled sandbox's process's status lacks %q:\n%s", want, status)
			}
		}
		// What a leaves: files in both writable places, a process.
		if _, _, exit := liveExec(t, a, sandbox.ExecRequest{Cmd: "echo a > /workspace/left-a && echo a > /tmp/left-a"}); *exit.ExitCode != 0 {
			t.Fatalf("writing a's files: %+v", exit)
		}
		if _, err := a.Exec(sandbox.ExecRequest{Cmd: "while :; do sleep 1; done # marker-pooled-a"}); err != nil {
			t.Fatal(err)
		}
		// A port, reached as a cold sandbox's is.
		if _, err := a.Exec(sandbox.ExecRequest{Cmd: "while :; do echo served | nc -l -p 8123; done"}); err != nil {
			t.Fatal(err)
		}
		var got string
		for deadline := time.Now().Add(30 * time.Second); got != "served\n"; time.Sleep(50 * time.Millisecond) {
			if c, err := a.DialPort(context.Background(), 8123); err == nil {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				b, _ := io.ReadAll(c)
				c.Close()
				got = string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pooled sandbox's port never answered: %q", got)
			}
		}

		// The next one was made while a lived: another uid, and nothing
		// of a's.
		b := create(2)
		if uidB := uidOf(b); uidB == uidA {
			t.Errorf("the next pooled sandbox has a's uid %d", uidA)
		}
		if err := a.Close(); err != nil {
			t.Errorf("closing a: %v", err)
		}
		out, _, _ := liveExec(t, b, sandbox.ExecRequest{Cmd: "ls -a /workspace /tmp; cat /proc/[0-9]*/cmdline | tr '\\0' ' '"})
		if strings.Contains(out, "left-a") || strings.Contains(out, "marker-pooled-a") {
			t.Errorf("the next pooled sandbox has what a left: %q", out)
		}
		if err := b.Close(); err != nil {
			t.Errorf("closing b: %v", err)
		}
	})
}

// TestServeLiveSandboxPool: serve's pool serves live sandboxes: the
// first create of an image moves the pool to a live sandbox's shape (a
// miss), and from then on a create takes the one it keeps ready, which
// holds nothing of the sandbox before it.
func TestServeLiveSandboxPool(t *testing.T) {
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock"),
		"pool": map[string]any{busyboxImage: 1}}, map[string]any{"local_images": []string{*imagesDir}})
	s := startServeWith(t, cfg)
	pool := func() server.PoolHealth {
		var h server.Health
		if code := s.get("/healthz", &h); code != 200 || h.Pool == nil {
			t.Fatalf("/healthz: %d %+v", code, h)
		}
		return *h.Pool
	}
	ready := func() {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); pool().Ready[busyboxImage] < 1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the pool made no sandbox: %+v", pool())
			}
		}
	}
	// The pool starts with a run's shape (a python task's, which the
	// busybox image cannot make): the first create is a miss.
	a := createSandbox(t, s)
	if p := pool(); p.Hits != 0 {
		t.Errorf("the first live sandbox was taken from a pool made for runs: %+v", p)
	}
	if out, _ := execOut(t, s, a.ID, `{"cmd": "echo a > /workspace/left-a; echo done"}`); out != "done\n" {
		t.Errorf("writing in a: %q", out)
	}
	for i := 0; i < 2; i++ {
		ready()
		b := createSandbox(t, s)
		if p := pool(); p.Hits != int64(i+1) {
			t.Errorf("live sandbox %d was not taken from the pool: %+v", i+2, p)
		}
		if out, _ := execOut(t, s, b.ID, `{"cmd": "ls /workspace; id -u"}`); strings.Contains(out, "left-a") {
			t.Errorf("a pooled sandbox holds what another left: %q", out)
		}
		if resp, body := s.do("DELETE", "/v1/sandboxes/"+b.ID, ""); resp.StatusCode != 204 {
			t.Errorf("DELETE: %d %s", resp.StatusCode, body)
		}
	}
	if resp, body := s.do("DELETE", "/v1/sandboxes/"+a.ID, ""); resp.StatusCode != 204 {
		t.Errorf("DELETE: %d %s", resp.StatusCode, body)
	}
	s.stop()
	assertNoLeaks(t)
}
