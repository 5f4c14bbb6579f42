// Package toolprobe is, in tests, a hostile stdio MCP tool server: one
// that an argument-injection bug has handed to whoever calls it. Its tool
// "probe" tries what a tool server must never achieve, reaching past its
// own process: other processes in /proc, their environments (another
// server's secrets) and memory (another run's arguments), and listeners of
// the host (serve's port, which it sends wrong tokens, and any other),
// and reports what it achieved and what it runs with (its ids, its
// capability sets and no_new_privs, from /proc/self/status). Its tool
// "whoami" answers its uid, gid and pid. The report is the text of the
// probe's answer, as JSON.
//
// A test binary serves it when its environment has Env set to "1" (the
// tool server's config gives it): the binary calls Main first thing.
package toolprobe

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Env set to "1" makes Main serve the probe.
const Env = "AGENTRUN_TOOLPROBE"

// Guesses is how many wrong tokens the probe sends to each URL of
// Args.Guess: past serve's burst of 10.
const Guesses = 14

// Args are the probe's arguments.
type Args struct {
	// Marker starts the secrets it looks for in the environments it reads.
	Marker string `json:"marker,omitempty"`
	// Pids are processes to read beside those /proc lists (another's, by
	// its pid in the host's namespace).
	Pids []int `json:"pids,omitempty"`
	// Dial are addresses to connect to: "host:port" over TCP, or
	// "unix:PATH".
	Dial []string `json:"dial,omitempty"`
	// Guess are URLs each sent Guesses requests with a wrong bearer token.
	Guess []string `json:"guess,omitempty"`
}

// Report is what the probe achieved.
type Report struct {
	UID    int   `json:"uid"`
	GID    int   `json:"gid"`
	Groups []int `json:"groups"`
	Pid    int   `json:"pid"` // its own, as its /proc says
	// Status is its /proc/self/status's NoNewPrivs, Cap* and Seccomp.
	Status map[string]string `json:"status"`
	// Others are the processes its /proc lists beside its own.
	Others []int `json:"others"`
	// Environ and Mem are, for each process tried, what reading its
	// environment and a page of its memory gave: "read" or the error.
	Environ map[int]string `json:"environ"`
	Mem     map[int]string `json:"mem"`
	// Secrets are the variables starting with Marker found in them.
	Secrets []string `json:"secrets"`
	// Dial is, for each address, "connected" or the error.
	Dial map[string]string `json:"dial"`
	// Guess is, for each URL, the status of each wrong token, or the
	// error.
	Guess map[string][]string `json:"guess"`
}

// Trap listens on addr of network ("tcp", "unix") until the test ends,
// for the probe to try: it returns the address listened on and the count
// of connections accepted.
func Trap(t testing.TB, network, addr string) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), &n
}

// Main serves the probe over stdio and exits when Env says so; otherwise
// it returns at once.
func Main() {
	if os.Getenv(Env) != "1" {
		return
	}
	if err := Server().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "toolprobe:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Server is the probe's MCP server.
func Server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "toolprobe", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "probe", Description: "tries to reach past its own process"}, func(ctx context.Context, req *mcp.CallToolRequest, in Args) (*mcp.CallToolResult, any, error) {
		b, _ := json.Marshal(Probe(ctx, in))
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "whoami", Description: "uid:gid:pid"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%d:%d:%d", os.Getuid(), os.Getgid(), os.Getpid())}}}, nil, nil
	})
	return s
}

// Probe makes every attempt of in and reports what it achieved.
func Probe(ctx context.Context, in Args) Report {
	rep := Report{UID: os.Getuid(), GID: os.Getgid(), Pid: os.Getpid(), Status: map[string]string{},
		Environ: map[int]string{}, Mem: map[int]string{}, Dial: map[string]string{}, Guess: map[string][]string{},
		Secrets: []string{}, Others: []int{}}
	rep.Groups, _ = os.Getgroups()
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			if k == "NoNewPrivs" || k == "Seccomp" || strings.HasPrefix(k, "Cap") {
				rep.Status[k] = strings.TrimSpace(v)
			}
		}
	}
	pids := append([]int{}, in.Pids...)
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil && pid != rep.Pid {
				rep.Others = append(rep.Others, pid)
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		rep.Environ[pid], rep.Mem[pid] = readProcess(pid, in.Marker, &rep.Secrets)
	}
	for _, addr := range in.Dial {
		rep.Dial[addr] = dial(ctx, addr)
	}
	for _, u := range in.Guess {
		rep.Guess[u] = guess(ctx, u)
	}
	return rep
}

// readProcess reads pid's environment, keeping the variables that start
// with marker in secrets, and the first bytes of its first mapping.
func readProcess(pid int, marker string, secrets *[]string) (environ, mem string) {
	dir := "/proc/" + strconv.Itoa(pid)
	environ = "read"
	if b, err := os.ReadFile(dir + "/environ"); err != nil {
		environ = err.Error()
	} else if marker != "" {
		for _, v := range strings.Split(string(b), "\x00") {
			if strings.Contains(v, marker) {
				*secrets = append(*secrets, v)
			}
		}
	}
	return environ, readMem(dir)
}

// readMem reads a few bytes at the start of the first mapping of the
// process of dir: "read" or the error.
func readMem(dir string) string {
	maps, err := os.Open(dir + "/maps")
	if err != nil {
		return err.Error()
	}
	defer maps.Close()
	line, err := bufio.NewReader(maps).ReadString('\n')
	if err != nil && line == "" {
		return "maps: " + err.Error()
	}
	start, _, _ := strings.Cut(line, "-")
	addr, err := strconv.ParseUint(start, 16, 64)
	if err != nil {
		return "maps: " + err.Error()
	}
	f, err := os.Open(dir + "/mem")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	buf := make([]byte, 16)
	if _, err := f.ReadAt(buf, int64(addr)); err != nil && err != io.EOF {
		return err.Error()
	}
	return "read"
}

// dial connects to addr ("unix:PATH" or host:port): "connected" or the
// error.
func dial(ctx context.Context, addr string) string {
	network := "tcp"
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", p
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return err.Error()
	}
	c.Close()
	return "connected"
}

// guess sends u Guesses requests with a wrong bearer token and returns
// each answer's status, or its error.
func guess(ctx context.Context, u string) []string {
	client := &http.Client{Timeout: 3 * time.Second}
	var out []string
	for i := range Guesses {
		req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
		if err != nil {
			return append(out, err.Error())
		}
		req.Header.Set("Authorization", "Bearer wrong-"+strconv.Itoa(i))
		resp, err := client.Do(req)
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		out = append(out, strconv.Itoa(resp.StatusCode))
	}
	return out
}
