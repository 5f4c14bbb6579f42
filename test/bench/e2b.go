package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/server"
)

var interpOnly = flag.Bool("interp-only", false, "measure the E2B sections only (runCode in a live context; the door's create, commands.run and commands.list; each against agentrun's own API) and print them (docs/bench.md is not written)")

// Names of the code interpreter section's contenders.
const (
	interpRunCodeName = "E2B runCode('44+1') in a live context (POST /e2b/execute)"
	interpExecName    = "live sandbox: exec python3 -c print(44+1)"
	interpPooledName  = "agentrun serve, warm pool: POST /v1/runs 44+1 (its value)"
)

// interpKey is the bench's E2B key.
const interpKey = "e2b_bench0123456789abcdef"

// interpSection is what the code interpreter section measured.
type interpSection struct {
	err  string
	cs   []*contender
	door []*contender // the E2B door's section (e2bdoor.go)
}

// interpBench measures a runCode round trip in a live context of E2B's
// code interpreter (internal/e2b/interp), raw HTTP over serve's unix
// socket as the SDK sends it, timed to end_of_execution, beside the same
// value through agentrun's own API: a process exec'd in a live sandbox,
// and a run on pool (a serve with a warm pool of one). Its serve is its
// own, with an e2b section.
func interpBench(work, rootfs string, pool *served, poolErr error) *interpSection {
	is := &interpSection{}
	dir := filepath.Join(work, "interp")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		is.err = err.Error()
		return is
	}
	keyFile := filepath.Join(dir, "bench.key")
	if err := os.WriteFile(keyFile, []byte(interpKey+"\n"), 0o600); err != nil {
		is.err = err.Error()
		return is
	}
	s, hc, err := startE2BServe(dir, rootfs, keyFile, "serve", 0)
	if err != nil {
		is.err = err.Error()
		return is
	}
	defer s.stop()
	e2b, err := newE2BSandbox(hc)
	if err != nil {
		is.err = err.Error()
		return is
	}
	defer e2b.kill()
	live, err := s.client.CreateSandbox(context.Background(), server.SandboxRequest{Timeout: config.MustDuration("30m")})
	if err != nil {
		is.err = fmt.Sprintf("creating a live sandbox: %v", err)
		return is
	}
	defer s.client.DeleteSandbox(context.Background(), live.ID)
	is.cs = []*contender{
		{name: interpRunCodeName, note: "the default context's interpreter made by a first call, untimed; each call is E2B's request as @e2b/code-interpreter sends it, timed to the stream's end",
			call: func(int) (time.Duration, string, error) { return e2b.runCode("44+1") }},
		{name: interpExecName, note: "POST /v1/sandboxes/ID/processes in a running live sandbox, timed to its exit event: a new interpreter each time",
			call: func(int) (time.Duration, string, error) {
				return s.execTimed(live.ID, []string{"python3", "-c", "print(44+1)"})
			}},
		pool.pooled(&contender{name: interpPooledName, note: "a pooled run of the expression, its value read from the result: a fresh sandbox each time (spaced: the pool refilled before each run)"}, poolErr,
			func() (string, error) {
				res, err := pool.client.Run(context.Background(), []byte(`{"code":"44+1"}`))
				if err != nil {
					return "", err
				}
				if res.Error != "" {
					return "", fmt.Errorf("%s", res.Error)
				}
				return res.Value["text/plain"] + "\n", nil
			}),
	}
	measure(is.cs)
	// The door's creates on a serve of their own whose pool of one
	// follows the first create's shape: a live sandbox's.
	ps, phc, psErr := startE2BServe(dir, rootfs, keyFile, "pool", 1)
	if ps != nil {
		defer ps.stop()
	}
	is.door = doorBench(hc, s, live.ID, ps, phc, psErr)
	return is
}

// startE2BServe starts a serve named name in dir with an E2B section
// (templates code-interpreter-v1 and base: rootfs; the bench's key in
// keyFile) and a pool of pool sandboxes of rootfs (none for 0); it
// returns it and an HTTP client that dials its unix socket.
func startE2BServe(dir, rootfs, keyFile, name string, pool int) (*served, *http.Client, error) {
	cfg := filepath.Join(dir, name+"-config.json")
	sock := filepath.Join(dir, name+".sock")
	pools := ""
	if pool > 0 {
		pools = fmt.Sprintf(`,"pool":{"dir:%s":%d}`, rootfs, pool)
	}
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"store_dir":%q,
		"policy":{"local_images":[%q]},
		"e2b":{"templates":{"code-interpreter-v1":"dir:%s","base":"dir:%s"},"keys":{"bench":{"file":%q}}},
		"server":{"listen":%q,"max_concurrent":8,"queue":64,"quota":{"runs_per_minute":0,"concurrent":0}%s}}`,
		rootfs, filepath.Join(dir, name+"-state"), filepath.Join(dir, name+"-store"), filepath.Dir(filepath.Dir(rootfs)), rootfs, rootfs, keyFile,
		"unix://"+sock, pools))
	s, err := launchServe(*bin, cfg, sock)
	if err != nil {
		return nil, nil, fmt.Errorf("agentrun serve (%s): %w", name, err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	return s, hc, nil
}

// e2bSandbox is a sandbox made through serve's E2B door.
type e2bSandbox struct {
	hc           *http.Client
	id, token    string
	trafficToken string
}

// newE2BSandbox creates a code-interpreter-v1 sandbox through the door
// and runs a first cell, which makes its default context.
func newE2BSandbox(hc *http.Client) (*e2bSandbox, error) {
	e, err := createE2B(context.Background(), hc, "code-interpreter-v1")
	if err != nil {
		return nil, err
	}
	if _, out, err := e.runCode("44+1"); err != nil || out != "45\n" {
		e.kill()
		return nil, fmt.Errorf("a first runCode: %q, %v", out, err)
	}
	return e, nil
}

// createE2B creates a sandbox of template through the door, as the SDK's
// Sandbox.create does.
func createE2B(ctx context.Context, hc *http.Client, template string) (*e2bSandbox, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://agentrun/e2b/v2/sandboxes", strings.NewReader(`{"templateID":"`+template+`","timeout":1800}`))
	req.Header.Set("X-API-Key", interpKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("creating an E2B sandbox: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var sb struct {
		SandboxID, EnvdAccessToken, TrafficAccessToken string
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &sb) != nil || sb.SandboxID == "" {
		return nil, fmt.Errorf("creating an E2B sandbox: %s: %s", resp.Status, firstLine(string(body)))
	}
	return &e2bSandbox{hc: hc, id: sb.SandboxID, token: sb.EnvdAccessToken, trafficToken: sb.TrafficAccessToken}, nil
}

// runCode runs code in the default context, timed to the stream's end,
// and returns its main result's text and a newline.
func (e *e2bSandbox) runCode(code string) (time.Duration, string, error) {
	ctx, cancel := call()
	defer cancel()
	b, _ := json.Marshal(map[string]string{"code": code})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://agentrun/e2b/execute", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", e.id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", e.token)
	req.Header.Set("E2b-Traffic-Access-Token", e.trafficToken)
	start := time.Now()
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, "", fmt.Errorf("execute: %s: %s", resp.Status, firstLine(string(msg)))
	}
	var text string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var m struct {
			Type, Text, Name, Value string
			Main                    bool `json:"is_main_result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return 0, "", err
		}
		switch m.Type {
		case "result":
			if m.Main {
				text = m.Text + "\n"
			}
		case "error":
			return 0, "", fmt.Errorf("%s: %s", m.Name, m.Value)
		case "end_of_execution":
			return time.Since(start), text, nil
		}
	}
	return 0, "", fmt.Errorf("the stream ended without end_of_execution: %v", sc.Err())
}

func (e *e2bSandbox) kill() {
	req, _ := http.NewRequest(http.MethodDelete, "http://agentrun/e2b/sandboxes/"+e.id, nil)
	req.Header.Set("X-API-Key", interpKey)
	if resp, err := e.hc.Do(req); err == nil {
		resp.Body.Close()
	}
}

// interpReport prints the code interpreter section.
func interpReport(w io.Writer, is *interpSection) {
	fmt.Fprintf(w, "\n## The code interpreter\n\n")
	if is.err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", is.err)
		return
	}
	fmt.Fprintf(w, "E2B's `runCode` ([e2b.md](e2b.md#the-code-interpreter)) in a live context, over serve's unix socket as the SDK sends it, beside the same value through agentrun's own API: a process in a live sandbox, and a pooled run; %d runs per contender, interleaved, the order reversed every other time.\n\n", *n)
	cpuTable(w, is.cs)
	defer doorReport(w, is.door)
	rc, ex := find(is.cs, interpRunCodeName), find(is.cs, interpExecName)
	if rc.err == "" && ex.err == "" && len(rc.times) > 0 && len(ex.times) > 0 {
		fmt.Fprintf(w, "\nA cell in a live context answers in %s, %.2f× a new interpreter exec'd in the same sandbox (%s): the context keeps the interpreter and its state.\n",
			ms(median(rc.times)), float64(median(rc.times))/float64(median(ex.times)), ms(median(ex.times)))
	}
}
