package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/server"
)

// served is an `agentrun serve` with a warm pool of one sandbox for the
// python image, and a client for its socket.
type served struct {
	cmd    *exec.Cmd
	client *server.Client
	sock   string
}

// startServe starts agentrun serve on a socket in work, with a pool of
// one sandbox.
func startServe(work, rootfs string) (*served, error) {
	s, err := startServeAs(*bin, work, rootfs, "serve", 1)
	if err != nil {
		return s, err
	}
	return s, s.waitReady()
}

// startServeAs starts agentrun serve of binary exe, named name (its
// socket, config and state in work), with a pool of pool sandboxes (none
// for 0), and returns once it listens.
func startServeAs(exe, work, rootfs, name string, pool int) (*served, error) {
	return startServeOn(exe, work, rootfs, name, pool, "libcontainer")
}

// startServeOn is startServeAs with runtime as the tasks' default, which
// the pool is seeded with.
func startServeOn(exe, work, rootfs, name string, pool int, runtime string) (*served, error) {
	return startServePool(exe, work, rootfs, name, strconv.Itoa(pool), runtime)
}

// startServePool is startServeOn with poolEntry, the JSON of the image's
// server.pool entry (a count, or {"count", "warm"}).
func startServePool(exe, work, rootfs, name, poolEntry, runtime string) (*served, error) {
	sock := filepath.Join(work, name+".sock")
	image := "dir:" + rootfs
	cfg := filepath.Join(work, name+"-config.json")
	write(cfg, fmt.Sprintf(`{"image":%q,"runtime":%q,"audit":"","state_dir":%q,"store_dir":%q,
		"runsc":{"path":%q,"flags":[]},
		"policy":{"local_images":[%q]},
		"server":{"listen":%q,"max_concurrent":8,"queue":64,"quota":{"runs_per_minute":0,"concurrent":0},"pool":{%q:%s}}}`,
		image, runtime, filepath.Join(work, name+"-state"), filepath.Join(work, name+"-store"), *runscBin, filepath.Dir(filepath.Dir(rootfs)),
		"unix://"+sock, image, poolEntry))
	return launchServe(exe, cfg, sock)
}

// launchServe starts `exe serve` with config file cfg, whose
// server.listen is unix socket sock, and returns once it listens.
func launchServe(exe, cfg, sock string) (*served, error) {
	s := &served{cmd: exec.Command(exe, "serve", "--config", cfg), sock: sock}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	listening := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "agentrun serve: listening on") {
				listening <- true
			}
		}
		listening <- false
	}()
	select {
	case ok := <-listening:
		if !ok {
			s.cmd.Wait()
			return nil, fmt.Errorf("agentrun serve exited")
		}
	case <-time.After(30 * time.Second):
		s.stop()
		return nil, fmt.Errorf("agentrun serve did not listen within 30s")
	}
	if s.client, err = server.NewClient("unix://"+sock, ""); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits until the pool holds a sandbox.
func (s *served) waitReady() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		h, err := s.client.Health(context.Background())
		if err != nil {
			return err
		}
		if h.Pool == nil {
			return fmt.Errorf("the server has no pool")
		}
		for _, n := range h.Pool.Ready {
			if n > 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool not filled within 30s: %s", h.Pool.LastError)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// post runs print(45) and returns the program's stdout.
func (s *served) post() (string, error) {
	res, err := s.client.Run(context.Background(), []byte(`{"code":"print(45)"}`))
	if err != nil {
		return "", err
	}
	if res.Error != "" {
		return "", fmt.Errorf("%s", res.Error)
	}
	return res.Stdout, nil
}

// peakRSS is the server's peak RSS so far, KiB.
func (s *served) peakRSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func (s *served) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
}

// poolContender times POST /v1/runs of print(45) against agentrun serve
// with a sandbox ready in its pool, to the whole answer.
func poolContender(s *served, err error) *contender {
	c := &contender{name: warmName, note: "POST /v1/runs over the unix socket, a sandbox prepared ahead (the program's start waiting for the hand-over); timed to the whole answer"}
	return s.pooled(c, err, s.post)
}

// pooled makes c time run with a sandbox ready in the pool. Between runs,
// untimed, the pool refills, so that the refill does not compete with the
// next contender. err is why the server is not there.
func (s *served) pooled(c *contender, err error, run func() (stdout string, err error)) *contender {
	if err != nil {
		c.err = err.Error()
		return c
	}
	c.call = func(int) (time.Duration, string, error) {
		if err := s.waitReady(); err != nil {
			return 0, "", err
		}
		start := time.Now()
		out, err := run()
		el := time.Since(start)
		if err != nil {
			return 0, "", err
		}
		return el, out, s.waitReady()
	}
	return c
}

// cliContender times `agentrun run --server` of print(45) against the
// same server: the CLI's own start plus a pooled run.
func cliContender(s *served, err error, task string) *contender {
	c := &contender{name: cliName, note: "a fresh `agentrun run` process per run that hands the task to serve over the socket (no root needed): the CLI with the warm pool"}
	return s.pooled(c, err, func() (string, error) {
		out, err := exec.Command(*bin, "run", "--server", "unix://"+s.sock, task).Output()
		if err != nil {
			return "", fmt.Errorf("%v: %s", err, firstLine(string(out)))
		}
		var res struct{ Stdout, Error string }
		if err := json.Unmarshal(out, &res); err != nil || res.Error != "" {
			return "", fmt.Errorf("result %s: %v", firstLine(string(out)), err)
		}
		return res.Stdout, nil
	})
}
