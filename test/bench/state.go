package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
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
	warm := warmStateContenders(work, rootfs)
	defer warm.stop()
	ss.cs = []*contender{
		{name: "bare chroot python3: print(45)", cmd: bare("print(45)")},
		{name: "agentrun run, kept session: print(45)", note: "keep_workspace, no state", cmd: run(plain)},
		{name: "agentrun run, kept session: print(45), keep_state", note: "a small state (one int) restored and saved", cmd: run(small)},
		{name: "bare chroot python3: build the 51 MB frame", cmd: bare(stateFrame + "print(45)")},
		{name: "agentrun run, kept session: build the 51 MB frame", note: "import numpy and pandas, make the frame", cmd: run(rebuild)},
		{name: "agentrun run, keep_state: restore the 51 MB frame", note: "unpickle the frame (pandas imported by it), and pickle it again at the end", cmd: run(restore)},
	}
	ss.cs = append(ss.cs, warm.cs...)
	measure(ss.cs)
	return ss
}

// Names of the warm contenders of the state section.
const (
	stateWarmPlain   = "agentrun serve, warm pool: print(45)"
	stateWarmSession = "agentrun serve, warm pool, kept session: print(45)"
	stateWarmSmall   = "agentrun serve, warm pool, kept session: print(45), keep_state"
)

// warmState is the state section's warm server and its contenders.
type warmState struct {
	s  *served
	cs []*contender
}

func (w *warmState) stop() {
	if w.s != nil {
		w.s.stop()
	}
}

// warmStateContenders starts serve with a warm pool of 2 on rootfs
// (numpy and pandas preloaded) and makes its contenders: print(45)
// without a session, in a kept session without state, and with a small
// state, each spaced (the pool full and idle before each run, untimed)
// and timed to the whole answer.
func warmStateContenders(work, rootfs string) *warmState {
	w := &warmState{}
	names := []string{stateWarmPlain, stateWarmSession, stateWarmSmall}
	fail := func(err error) *warmState {
		w.cs = nil
		for _, name := range names {
			w.cs = append(w.cs, &contender{name: name, err: err.Error()})
		}
		return w
	}
	var err error
	if w.s, err = startServePool(*bin, work, rootfs, "state-warm", warmPoolEntry, "libcontainer"); err != nil {
		return fail(err)
	}
	cfg := filepath.Join(work, "state-warm-config.json")
	var ids [2]string
	for i := range ids {
		out, err := exec.Command(*bin, "sessions", "--config", cfg, "new").CombinedOutput()
		if err != nil {
			return fail(fmt.Errorf("sessions new: %v: %s", err, firstLine(string(out))))
		}
		ids[i] = strings.TrimSpace(string(out))
	}
	tasks := []string{
		`{"code":"print(45)","limits":{"timeout":"60s"}}`,
		fmt.Sprintf(`{"code":"x = 1\nprint(45)","session":%q,"keep_workspace":true,"limits":{"timeout":"60s"}}`, ids[0]),
		fmt.Sprintf(`{"code":"x = (x if 'x' in globals() else 0) + 1\nprint(45)","session":%q,"keep_state":true,"limits":{"timeout":"60s"}}`, ids[1]),
	}
	notes := []string{"POST /v1/runs, a warm sandbox; timed to the whole answer",
		"keep_workspace, no state: the session's disk mounted on the warm sandbox's workspace at the take",
		"a small state (one int) restored and saved in the warm sandbox"}
	for i, name := range names {
		task := tasks[i]
		c := &contender{name: name, note: notes[i]}
		c.call = func(int) (time.Duration, string, error) {
			if err := w.s.idle(2); err != nil {
				return 0, "", err
			}
			start := time.Now()
			res, err := w.s.client.Run(context.Background(), []byte(task))
			el := time.Since(start)
			if err != nil {
				return 0, "", err
			}
			if res.Error != "" {
				return 0, "", fmt.Errorf("%s", res.Error)
			}
			if res.State != nil && !res.State.Saved {
				return 0, "", fmt.Errorf("state not saved: %s", res.State.Reason)
			}
			return el, res.Stdout, nil
		}
		w.cs = append(w.cs, c)
	}
	return w
}

// stateReport prints the kept-state section.
func stateReport(w io.Writer, ss *stateSection) {
	fmt.Fprintf(w, "\n## Kept state\n\n")
	if ss.err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", ss.err)
		return
	}
	fmt.Fprintf(w, "The python-data test image (numpy, pandas), cold `agentrun run`s in kept sessions, and `agentrun serve` with a warm pool of 2 (numpy and pandas preloaded; spaced: the pool full and idle before each run), %d runs per contender, interleaved, the order reversed every other time. A run with keep_state restores the session's state before its code and saves it after; on the warm pool it takes a warm sandbox, the session's disk mounted on its workspace at the take.\n\n", *n)
	cpuTable(w, ss.cs)
	byName := map[string]*contender{}
	for _, c := range ss.cs {
		byName[c.name] = c
	}
	ratio := func(a, b string) string {
		ca, cb := byName[a], byName[b]
		if ca == nil || cb == nil || len(ca.times) == 0 || len(cb.times) == 0 {
			return "not measured"
		}
		return fmt.Sprintf("%.2f×", float64(median(ca.times))/float64(median(cb.times)))
	}
	fmt.Fprintf(w, "\nA small state against none: %s cold, %s warm (against a warm stateless call without a session; the target is 1.5× or less). Restoring the frame against building it again: %s.\n",
		ratio("agentrun run, kept session: print(45), keep_state", "agentrun run, kept session: print(45)"),
		ratio(stateWarmSmall, stateWarmPlain),
		ratio("agentrun run, keep_state: restore the 51 MB frame", "agentrun run, kept session: build the 51 MB frame"))
	fmt.Fprintln(w, "\nThe frame here is made of random numbers, about 35 ms of work once numpy and pandas are imported (both contenders import them: unpickling the frame does): restoring it is an unpickle of 51 MB (about 125 ms in the sandbox's python) and the run's end pickles it again (about 130 ms; a state that did not change is not written again). So a state pays off where what made it costs more than its pickle: a frame read from files, a model fitted, a computation; not where it is as cheap to make again as this one.")
}

// cpuTable writes the table of cs's medians, p90s, CPU per run and notes.
func cpuTable(w io.Writer, cs []*contender) {
	fmt.Fprintln(w, "| contender | median | p90 | CPU/run | note |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range cs {
		if c.err != "" || len(c.times) == 0 {
			fmt.Fprintf(w, "| %s | not measured: %s | | | |\n", c.name, strings.ReplaceAll(firstLine(c.err), "|", "/"))
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c.name, ms(median(c.times)), ms(pct(c.times, 0.9)), cpuPerRun(c), c.note)
	}
}
