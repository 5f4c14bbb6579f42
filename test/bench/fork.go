package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

var forkOnly = flag.Bool("fork-only", false, "measure the session fork section only and print it (docs/bench.md is not written)")

// forkSection is a fork of a session holding 100 MiB, 8 ways, beside
// cp(1) making the same 8 copies of its disk image.
type forkSection struct {
	mode       string // reflink or copy: how this store copies
	fork, cp   []time.Duration
	copiedMiB  float64
	err        string
	sessionMiB int
}

const (
	forkWays = 8
	forkMiB  = 100
	forkRuns = 5
)

// forkBench makes a session in a store under work, fills it with 100 MiB
// from a run, then times `agentrun sessions fork ID 8` and `cp
// --sparse=always --reflink=auto` of its disk image 8 times, interleaved;
// each try's copies are removed, untimed.
func forkBench(work, rootfs string) *forkSection {
	fs := &forkSection{sessionMiB: forkMiB}
	cfg := filepath.Join(work, "fork-config.json")
	store := filepath.Join(work, "fork-store")
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"store_dir":%q,"sessions":{"max_bytes":"256m"}}`,
		rootfs, filepath.Join(work, "fork-state"), store))
	agentrun := func(args ...string) (string, error) {
		out, err := exec.Command(*bin, append([]string{args[0], "--config", cfg}, args[1:]...)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("agentrun %s: %v: %s", strings.Join(args, " "), err, firstLine(string(out)))
		}
		return string(out), nil
	}
	out, err := agentrun("sessions", "new")
	if err != nil {
		fs.err = err.Error()
		return fs
	}
	id := strings.TrimSpace(out)
	task := filepath.Join(work, "fork-fill.json")
	write(task, fmt.Sprintf(`{"code":"import os\nwith open('data.bin', 'wb') as f:\n    for _ in range(%d): f.write(os.urandom(1 << 20))","session":%q,"keep_workspace":true}`, forkMiB, id))
	if _, err := agentrun("run", task); err != nil {
		fs.err = err.Error()
		return fs
	}
	img := filepath.Join(store, "sessions", id, "disk.img")
	cpDir := filepath.Join(work, "fork-cp")
	for range forkRuns {
		start := time.Now()
		out, err := agentrun("sessions", "--json", "fork", id, fmt.Sprint(forkWays))
		d := time.Since(start)
		if err != nil {
			fs.err = err.Error()
			return fs
		}
		var f struct {
			IDs    []string `json:"ids"`
			Copy   string   `json:"copy"`
			Copied int64    `json:"copied_bytes"`
		}
		if err := json.Unmarshal([]byte(out), &f); err != nil || len(f.IDs) != forkWays {
			fs.err = fmt.Sprintf("sessions fork: %v: %s", err, firstLine(out))
			return fs
		}
		fs.fork = append(fs.fork, d)
		fs.mode, fs.copiedMiB = f.Copy, float64(f.Copied)/(1<<20)
		for _, c := range f.IDs {
			if _, err := agentrun("sessions", "rm", c); err != nil {
				fs.err = err.Error()
				return fs
			}
		}

		os.MkdirAll(cpDir, 0o700)
		start = time.Now()
		for i := range forkWays {
			if out, err := exec.Command("cp", "--sparse=always", "--reflink=auto", img, filepath.Join(cpDir, fmt.Sprint(i))).CombinedOutput(); err != nil {
				fs.err = fmt.Sprintf("cp: %v: %s", err, firstLine(string(out)))
				return fs
			}
		}
		fs.cp = append(fs.cp, time.Since(start))
		os.RemoveAll(cpDir)
	}
	agentrun("sessions", "rm", id)
	return fs
}

// forkReport prints the fork section.
func forkReport(w io.Writer, fs *forkSection) {
	fmt.Fprintf(w, "\n## Session fork\n\n")
	if fs.err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", fs.err)
		return
	}
	fmt.Fprintf(w, "A kept session holding %d MiB (random bytes written by a run), forked %d ways by `agentrun sessions fork` (a process start, the session's lock, its disk detached, %d copies of its files, each a session of its own), beside `cp --sparse=always --reflink=auto` of its disk image %d times; %d tries each, interleaved. This store copies by **%s**, %.0f MiB written per fork.\n\n",
		fs.sessionMiB, forkWays, forkWays, forkWays, forkRuns, fs.mode, fs.copiedMiB)
	fmt.Fprintln(w, "| contender | median | max |")
	fmt.Fprintln(w, "|---|---|---|")
	fmt.Fprintf(w, "| agentrun sessions fork ID %d | %s | %s |\n", forkWays, ms(median(fs.fork)), ms(pct(fs.fork, 1)))
	fmt.Fprintf(w, "| cp of the disk image, %d times | %s | %s |\n", forkWays, ms(median(fs.cp)), ms(pct(fs.cp, 1)))
	if c := median(fs.cp); c > 0 {
		fmt.Fprintf(w, "\nfork against cp: %.2f×\n", float64(median(fs.fork))/float64(c))
	}
	fmt.Fprintln(w, "\nWhere a store copies, a fork writes what the session holds once per copy: it grows with N × the data, never N × `max_bytes` (holes stay holes). On a store on XFS or btrfs the copies share blocks (`reflink`) and a fork costs about the same at any size ([sessions.md](sessions.md#fork)).")
}
