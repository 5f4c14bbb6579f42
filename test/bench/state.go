package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

var stateOnly = flag.Bool("state-only", false, "measure the kept-state section only (python-data image) and print it (docs/bench.md is not written)")

// stateSection is what the kept-state section measured.
type stateSection struct {
	err string
	cs  []*contender
}

// The frame of the state section: 800,000 × 8 float64, 51 MB.
const stateFrame = "import numpy as np, pandas as pd\ndf = pd.DataFrame(np.random.default_rng(1).random((800_000, 8)))\n"

// stateBench measures kept state on the python-data image, cold
// `agentrun run`s in kept sessions, interleaved: print(45) without state,
// with a small state (keep_state), rebuilding a 51 MB pandas frame in
// each run without state, and restoring that frame from the state (which
// the run saves again at its end), beside bare python in a chroot doing
// the same work.
func stateBench(work string) *stateSection {
	ss := &stateSection{}
	rootfs := filepath.Join(*images, "python-data", "rootfs")
	if _, err := os.Stat(filepath.Join(rootfs, "bin")); err != nil {
		ss.err = fmt.Sprintf("no python-data image (test/images/build.sh python-data): %v", err)
		return ss
	}
	cfg := filepath.Join(work, "state-config.json")
	write(cfg, fmt.Sprintf(`{"image":"dir:%s","audit":"","state_dir":%q,"store_dir":%q,"sessions":{"max_bytes":"512m","state_max_bytes":"256m"}}`,
		rootfs, filepath.Join(work, "state-state"), filepath.Join(work, "state-store")))
	newSession := func() (string, error) {
		out, err := exec.Command(*bin, "sessions", "--config", cfg, "new").CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("sessions new: %v: %s", err, firstLine(string(out)))
		}
		return strings.TrimSpace(string(out)), nil
	}
	task := func(name, code, session string, state bool) (string, error) {
		p := filepath.Join(work, "state-"+name+".json")
		field := "keep_workspace"
		if state {
			field = "keep_state"
		}
		write(p, fmt.Sprintf(`{"code":%q,"session":%q,%q:true,"limits":{"memory":"1g","tmp_size":"64m","timeout":"60s"}}`, code, session, field))
		return p, nil
	}
	run := func(t string) func(int) *exec.Cmd {
		return func(int) *exec.Cmd { return exec.Command(*bin, "run", "--config", cfg, t) }
	}
	var ids [4]string
	for i := range ids {
		id, err := newSession()
		if err != nil {
			ss.err = err.Error()
			return ss
		}
		ids[i] = id
	}
	defer func() {
		for _, id := range ids {
			exec.Command(*bin, "sessions", "--config", cfg, "rm", id).Run()
		}
	}()
	plain, _ := task("plain", "x = 1\nprint(45)", ids[0], false)
	small, _ := task("small", "x = (x if 'x' in globals() else 0) + 1\nprint(45)", ids[1], true)
	rebuild, _ := task("rebuild", stateFrame+"print(45)", ids[2], false)
	restore, _ := task("restore", "print(45 if len(df) == 800_000 else 0)", ids[3], true)
	// The state to restore: the frame, saved once.
	seed, _ := task("seed", stateFrame+"print(45)", ids[3], true)
	if out, err := exec.Command(*bin, "run", "--config", cfg, seed).CombinedOutput(); err != nil || !strings.Contains(string(out), `"saved": true`) {
		ss.err = fmt.Sprintf("saving the frame's state: %v: %s", err, firstLine(string(out)))
		return ss
	}
	bare := func(code string) func(int) *exec.Cmd {
		return func(int) *exec.Cmd { return exec.Command("chroot", rootfs, "python3", "-c", code) }
	}
	ss.cs = []*contender{
		{name: "bare chroot python3: print(45)", cmd: bare("print(45)")},
		{name: "agentrun run, kept session: print(45)", note: "keep_workspace, no state", cmd: run(plain)},
		{name: "agentrun run, kept session: print(45), keep_state", note: "a small state (one int) restored and saved", cmd: run(small)},
		{name: "bare chroot python3: build the 51 MB frame", cmd: bare(stateFrame + "print(45)")},
		{name: "agentrun run, kept session: build the 51 MB frame", note: "import numpy and pandas, make the frame", cmd: run(rebuild)},
		{name: "agentrun run, keep_state: restore the 51 MB frame", note: "unpickle the frame (pandas imported by it), and pickle it again at the end", cmd: run(restore)},
	}
	measure(ss.cs)
	return ss
}

// stateReport prints the kept-state section.
func stateReport(w io.Writer, ss *stateSection) {
	fmt.Fprintf(w, "\n## Kept state\n\n")
	if ss.err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", ss.err)
		return
	}
	fmt.Fprintf(w, "The python-data test image (numpy, pandas), cold `agentrun run`s in kept sessions (a kept session never runs warm), %d runs per contender, interleaved. A run with keep_state restores the session's state before its code and saves it after.\n\n", *n)
	fmt.Fprintln(w, "| contender | median | p90 | CPU/run | note |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	byName := map[string]*contender{}
	for _, c := range ss.cs {
		byName[c.name] = c
		if c.err != "" || len(c.times) == 0 {
			fmt.Fprintf(w, "| %s | not measured: %s | | | |\n", c.name, c.err)
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c.name, ms(median(c.times)), ms(pct(c.times, 0.9)), cpuPerRun(c), c.note)
	}
	ratio := func(a, b string) string {
		ca, cb := byName[a], byName[b]
		if ca == nil || cb == nil || len(ca.times) == 0 || len(cb.times) == 0 {
			return "not measured"
		}
		return fmt.Sprintf("%.2f×", float64(median(ca.times))/float64(median(cb.times)))
	}
	fmt.Fprintf(w, "\nA small state against none: %s. Restoring the frame against building it again: %s.\n",
		ratio("agentrun run, kept session: print(45), keep_state", "agentrun run, kept session: print(45)"),
		ratio("agentrun run, keep_state: restore the 51 MB frame", "agentrun run, kept session: build the 51 MB frame"))
	fmt.Fprintln(w, "\nThe frame here is made of random numbers, about 35 ms of work once numpy and pandas are imported (both contenders import them: unpickling the frame does): restoring it is an unpickle of 51 MB (about 125 ms in the sandbox's python) and the run's end pickles it again (about 130 ms; a state that did not change is not written again). So a state pays off where what made it costs more than its pickle: a frame read from files, a model fitted, a computation; not where it is as cheap to make again as this one.")
}
