package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/agentrun/agentrun/internal/e2b"
	"github.com/agentrun/agentrun/internal/e2b/envd/process"
	"github.com/agentrun/agentrun/internal/e2b/envd/process/processconnect"
)

// Names of the E2B door's contenders.
const (
	doorCreateName = "E2B Sandbox.create from the pool + commands.run('true') (POST /e2b/v2/sandboxes, process.Process/Start)"
	v1CreateName   = "agentrun: POST /v1/sandboxes from the pool + POST …/processes true"
	doorRunName    = "E2B commands.run('true') (process.Process/Start over Connect)"
	v1RunName      = "agentrun: POST /v1/sandboxes/ID/processes true"
	doorListName   = "E2B commands.list() (process.Process/List over Connect)"
	v1ListName     = "agentrun: GET /v1/sandboxes/ID/processes"
)

// doorTarget is what the E2B layer may add to a call.
const doorTarget = 2 * time.Millisecond

// doorBench measures the E2B door (internal/e2b) against agentrun's own
// API on serve s (its E2B key interpKey, over the unix socket hc
// dials): a sandbox created and a first `true` run in it, timed to the
// process's end, deleted after, untimed, on ps (over phc), whose pool of
// one a first create moves to a live sandbox's shape, each create a pool
// hit; and `true` run in a running sandbox (the door's: one made here;
// agentrun's: live). The door's process calls are envd's Connect
// protocol spoken by the generated Go client, the server path the SDK's
// commands.run takes; the command is `true` itself on both sides (the
// SDK wraps it in `/bin/bash -l -c`, which would cost both the same).
func doorBench(hc *http.Client, s *served, live string, ps *served, phc *http.Client, psErr error) []*contender {
	ctx := context.Background()
	sb, err := createE2B(ctx, hc, "base")
	if err != nil {
		return []*contender{{name: doorRunName, err: err.Error()}}
	}
	defer sb.kill()
	if psErr == nil {
		// The first create moves the pool to a live sandbox's shape.
		if _, _, err := doorCreateRun(phc); err != nil {
			psErr = fmt.Errorf("a first E2B sandbox: %w", err)
		}
	}
	cs := []*contender{
		ps.poolHit(&contender{name: doorCreateName, quiet: true, note: "a base sandbox created through the door as the SDK's Sandbox.create does, taken from the pool (spaced: the pool refilled before each create), then `true` started in it through envd's process service, timed to its end event; killed after, untimed"},
			psErr, func() (time.Duration, string, error) { return doorCreateRun(phc) }),
		ps.poolHit(&contender{name: v1CreateName, quiet: true, note: "the same through agentrun's own API on the same serve, timed to the process's exit event; deleted after, untimed"},
			psErr, func() (time.Duration, string, error) { return ps.createThenExec([]string{"true"}, false) }),
		{name: doorRunName, quiet: true, note: "`true` in a running sandbox through envd's process service, as the SDK's commands.run sends it (Connect, server streaming), timed to its end event",
			call: func(int) (time.Duration, string, error) {
				ctx, cancel := call()
				defer cancel()
				start := time.Now()
				out, err := sb.run(ctx, "true")
				return time.Since(start), out, err
			}},
		{name: v1RunName, quiet: true, note: "the same through agentrun's own API in a running live sandbox, timed to its exit event",
			call: func(int) (time.Duration, string, error) { return s.execTrue(live) }},
		{name: doorListName, quiet: true, note: "the processes of a running sandbox through envd's process service: no process made, so the door's own work (key and token, the Connect codec, the sandbox's record) and serve's",
			call: func(int) (time.Duration, string, error) {
				ctx, cancel := call()
				defer cancel()
				start := time.Now()
				err := sb.list(ctx)
				return time.Since(start), "", err
			}},
		{name: v1ListName, quiet: true, note: "the same through agentrun's own API",
			call: func(int) (time.Duration, string, error) {
				ctx, cancel := call()
				defer cancel()
				url, hc := s.client.HTTP("/v1/sandboxes/" + live + "/processes")
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				start := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					return 0, "", err
				}
				_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				el := time.Since(start)
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("GET processes: %s", resp.Status)
				}
				return el, "", err
			}},
	}
	measure(cs)
	return cs
}

// doorCreateRun creates a base sandbox through the door over hc and runs
// `true` in it, timed to its end event; it kills it after, untimed.
func doorCreateRun(hc *http.Client) (time.Duration, string, error) {
	ctx, cancel := call()
	defer cancel()
	start := time.Now()
	e, err := createE2B(ctx, hc, "base")
	if err != nil {
		return 0, "", err
	}
	out, err := e.run(ctx, "true")
	el := time.Since(start)
	if kerr := e.killErr(ctx); err == nil && kerr != nil {
		err = kerr
	}
	return el, out, err
}

// The envd process package builds its descriptors on demand (make
// e2b-proto): this process's clients use them.
func init() { process.Register() }

// list lists the sandbox's processes through envd's process service.
func (e *e2bSandbox) list(ctx context.Context) error {
	pc := processconnect.NewProcessClient(e.hc, "http://agentrun/e2b", connect.WithProtoJSON())
	req := connect.NewRequest(&process.ListRequest{})
	e.headers(req.Header())
	if _, err := pc.List(ctx, req); err != nil {
		return fmt.Errorf("process.Process/List: %w", err)
	}
	return nil
}

// headers sets the headers of a call into the sandbox's envd.
func (e *e2bSandbox) headers(h http.Header) {
	h.Set(e2b.SandboxIDHeader, e.id)
	h.Set(e2b.SandboxPortHeader, strconv.Itoa(e2b.EnvdPort))
	h.Set(e2b.AccessTokenHeader, e.token)
}

// run starts cmd through envd's process service and reads its stream to
// the end event; it returns its stdout and stderr.
func (e *e2bSandbox) run(ctx context.Context, cmd string) (string, error) {
	// As the SDK sends it: JSON, stdin closed unless asked for.
	pc := processconnect.NewProcessClient(e.hc, "http://agentrun/e2b", connect.WithProtoJSON())
	noStdin := false
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: cmd}, Stdin: &noStdin})
	e.headers(req.Header())
	st, err := pc.Start(ctx, req)
	if err != nil {
		return "", fmt.Errorf("process.Process/Start: %w", err)
	}
	defer st.Close()
	var out strings.Builder
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			if end.GetExitCode() != 0 || !end.GetExited() {
				return out.String(), fmt.Errorf("%s ended: %s", cmd, end.GetStatus())
			}
			return out.String(), nil
		}
	}
	return out.String(), fmt.Errorf("%s: the stream ended without its end event: %v", cmd, st.Err())
}

// killErr kills the sandbox through the control API and says why not.
func (e *e2bSandbox) killErr(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, "http://agentrun/e2b/sandboxes/"+e.id, nil)
	req.Header.Set("X-API-Key", interpKey)
	resp, err := e.hc.Do(req)
	if err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("kill: %s: %s", resp.Status, firstLine(string(b)))
	}
	return nil
}

// doorReport prints the E2B door's section: its contenders, and what the
// layer adds to a call beside agentrun's own API, against doorTarget.
func doorReport(w io.Writer, cs []*contender) {
	fmt.Fprintf(w, "\n## The E2B door\n\n")
	if len(cs) == 1 && cs[0].err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", cs[0].err)
		return
	}
	fmt.Fprintf(w, "E2B's control API and envd's process service ([e2b.md](e2b.md)), over serve's unix socket as the SDK sends them (the process calls in envd's Connect protocol with JSON and stdin closed as the SDK sends them, by the generated Go client), beside the same through agentrun's own API on the same serve; %d runs per contender, interleaved, the order reversed every other time.\n\n", *n)
	cpuTable(w, cs)
	fmt.Fprintln(w)
	for _, p := range [][2]string{{doorCreateName, v1CreateName}, {doorRunName, v1RunName}, {doorListName, v1ListName}} {
		d, a := find(cs, p[0]), find(cs, p[1])
		if d.err != "" || a.err != "" || len(d.times) == 0 || len(a.times) == 0 {
			continue
		}
		diff := pairedDiff(d.times, a.times)
		met := "met"
		if diff >= doorTarget {
			met = "NOT met"
		}
		fmt.Fprintf(w, "- %s: %s against %s; the E2B layer adds %+.2f ms per call (the median of the differences of the runs made one after the other; target under %s: %s).\n",
			p[0], ms(median(d.times)), ms(median(a.times)), float64(diff)/float64(time.Millisecond), doorTarget, met)
	}
}

// pairedDiff is the median of a[i]-b[i]: measure runs the i-th of each
// contender one after the other, so a pair shares the host's load of its
// moment, which the difference of the two medians does not.
func pairedDiff(a, b []time.Duration) time.Duration {
	d := make([]time.Duration, min(len(a), len(b)))
	for i := range d {
		d[i] = a[i] - b[i]
	}
	return median(d)
}
