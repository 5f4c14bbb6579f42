package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

var warmOnly = flag.Bool("warm-only", false, "measure the warm-interpreter section only (python-data image) and print it (docs/bench.md is not written)")

// warmPoolEntry is the warm server's server.pool entry.
const warmPoolEntry = `{"count":2,"warm":{"language":"python","preload":["numpy","pandas"]}}`

// Names of the warm section's contenders.
const (
	warmBarePrint   = "bare python3 -c 'print(45)'"
	warmPlainPrint  = "agentrun serve, plain pool: print(45)"
	warmWarmPrint   = "agentrun serve, warm pool: print(45)"
	warmBareImport  = "bare python3 -c 'import numpy, pandas'"
	warmPlainImport = "agentrun serve, plain pool: import numpy, pandas"
	warmWarmImport  = "agentrun serve, warm pool: import numpy, pandas"
	warmBasePrint   = "baseline serve, plain pool: print(45)"
)

// warmSection is what the warm-interpreter section measured.
type warmSection struct {
	err  string
	k1   []*contender
	load []*loadSubject // at k = warmK
}

// warmK is the concurrency of the section's throughput.
const warmK = 4

// warmBench measures warm interpreters on the python-data image (numpy
// and pandas; test/images/build.sh python-data): at k=1, spaced (each
// run starts with both servers' pools full and idle), print(45) and
// `import numpy, pandas` bare in a chroot, on serve with a plain pool of
// 2 and on serve with a warm pool of 2 that preloads both modules; then
// print(45) runs/s at k=4 of the three. With -baseline, that binary's
// serve with a plain pool of 2 runs the spaced print(45) too,
// interleaved.
func warmBench(work string) *warmSection {
	ws := &warmSection{}
	rootfs := filepath.Join(*images, "python-data", "rootfs")
	if _, err := os.Stat(filepath.Join(rootfs, "bin")); err != nil {
		ws.err = fmt.Sprintf("no python-data image (test/images/build.sh python-data): %v", err)
		return ws
	}
	plain, perr := startServePool(*bin, work, rootfs, "warm-plain", "2", "libcontainer")
	if plain != nil {
		defer plain.stop()
	}
	warm, werr := startServePool(*bin, work, rootfs, "warm", warmPoolEntry, "libcontainer")
	if warm != nil {
		defer warm.stop()
	}
	var base *served
	var berr error
	if *baseline != "" {
		if base, berr = startServePool(*baseline, work, rootfs, "warm-baseline", "2", "libcontainer"); base != nil {
			defer base.stop()
		}
	}
	spaced := func() error {
		for _, s := range []*served{plain, warm, base} {
			if s != nil {
				if err := s.idle(2); err != nil {
					return err
				}
			}
		}
		return nil
	}
	bare := func(name, code string) *contender {
		c := &contender{name: name, note: "chroot into the image, no isolation"}
		c.call = func(int) (time.Duration, string, error) {
			if err := spaced(); err != nil {
				return 0, "", err
			}
			cmd := exec.Command("chroot", rootfs, "python3", "-c", code)
			start := time.Now()
			out, err := cmd.Output()
			return time.Since(start), string(out), err
		}
		return c
	}
	pooled := func(s *served, err error, name, note, code string) *contender {
		c := &contender{name: name, note: note}
		if err != nil {
			c.err = err.Error()
			return c
		}
		// A timeout for a cold import on a busy machine (not part of a
		// sandbox's shape).
		task := fmt.Sprintf(`{"code":%q,"limits":{"timeout":"60s"}}`, code)
		c.call = func(int) (time.Duration, string, error) {
			if err := spaced(); err != nil {
				return 0, "", err
			}
			start := time.Now()
			res, err := s.client.Run(context.Background(), []byte(task))
			el := time.Since(start)
			if err != nil {
				return 0, "", err
			}
			if res.Error != "" {
				return 0, "", fmt.Errorf("%s", res.Error)
			}
			return el, res.Stdout, nil
		}
		return c
	}
	const imp = "import numpy, pandas\nprint(45)"
	plainNote := "POST /v1/runs, a plain pooled sandbox (the program's start waiting for the hand-over); timed to the whole answer"
	warmNote := "POST /v1/runs, a warm sandbox (python started, numpy and pandas imported); timed to the whole answer"
	ws.k1 = []*contender{
		bare(warmBarePrint, "print(45)"),
		pooled(plain, perr, warmPlainPrint, plainNote, "print(45)"),
		pooled(warm, werr, warmWarmPrint, warmNote, "print(45)"),
		bare(warmBareImport, imp),
		pooled(plain, perr, warmPlainImport, plainNote, imp),
		pooled(warm, werr, warmWarmImport, warmNote, imp),
	}
	if *baseline != "" {
		ws.k1 = append(ws.k1, pooled(base, berr, warmBasePrint, "the same, on -baseline's serve", "print(45)"))
	}
	measure(ws.k1)

	bareLoad := &loadSubject{name: "bare chroot python3", note: "the floor",
		run: func() error {
			return checkCmd(exec.Command("chroot", rootfs, "python3", "-c", "print(45)"))
		},
		cpu: childrenCPU}
	ws.load = []*loadSubject{bareLoad,
		plain.subject("agentrun serve, plain pool of 2", "", perr, 2, `{"code":"print(45)"}`),
		warm.subject("agentrun serve, warm pool of 2", "", werr, 2, `{"code":"print(45)"}`)}
	for _, s := range ws.load {
		s.tput, s.lat, s.cpuRun, s.host = map[int][]float64{}, map[int][]time.Duration{}, map[int][]time.Duration{}, map[int][]time.Duration{}
		if s.err == "" {
			if err := s.run(); err != nil {
				s.err = err.Error()
			}
		}
	}
	for round := range *loadRounds {
		for _, s := range inTurn(ws.load, round) {
			if s.err == "" {
				if err := s.measure(warmK); err != nil {
					s.err = err.Error()
					log.Printf("warm: %s, round %d: %v", s.name, round+1, err)
				}
			}
		}
	}
	return ws
}

// warmReport writes the warm-interpreter section.
func warmReport(w io.Writer, ws *warmSection) {
	fmt.Fprintf(w, "\n## Warm interpreters\n\n")
	if ws.err != "" {
		fmt.Fprintf(w, "Not measured: %s\n", ws.err)
		return
	}
	fmt.Fprintf(w, "The python-data test image (Debian's python3, numpy and pandas). Spaced requests at k=1: before each run, untimed, the servers are idle with their pools of 2 full. %d runs per contender, interleaved, the order reversed every other time. The warm pool preloads numpy and pandas.\n\n", *n)
	fmt.Fprintln(w, "| contender | median | p90 | max | note |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range ws.k1 {
		if c.err != "" || len(c.times) == 0 {
			fmt.Fprintf(w, "| %s | – | – | – | not measured: %s |\n", c.name, strings.ReplaceAll(firstLine(c.err), "|", "/"))
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c.name, ms(median(c.times)), ms(pct(c.times, 0.9)), ms(maxOf(c.times)), c.note)
	}
	fmt.Fprintf(w, "\nprint(45) back to back by %d clients at once, %d runs per subject and round, %d rounds (median runs/s):\n\n| subject | runs/s | × bare | p50 | p99 |\n|---|---|---|---|---|\n", warmK, *loadRuns, *loadRounds)
	bareTput := medianF(ws.load[0].tput[warmK])
	for _, s := range ws.load {
		if s.err != "" || len(s.tput[warmK]) == 0 {
			fmt.Fprintf(w, "| %s | – | – | – | not measured: %s |\n", s.name, strings.ReplaceAll(firstLine(s.err), "|", "/"))
			continue
		}
		fmt.Fprintf(w, "| %s | %.1f | %.2f× | %s | %s |\n", s.name, medianF(s.tput[warmK]), medianF(s.tput[warmK])/bareTput,
			ms(median(s.lat[warmK])), ms(pct(s.lat[warmK], 0.99)))
	}
	fmt.Fprintf(w, "\nWhere this run stands against the warm targets:\n\n| target | measured | met |\n|---|---|---|\n")
	ratio := func(target, a, b string, max float64) {
		ca, cb := find(ws.k1, a), find(ws.k1, b)
		if ca.err != "" || cb.err != "" || len(ca.times) == 0 || len(cb.times) == 0 {
			fmt.Fprintf(w, "| %s | not measured | – |\n", target)
			return
		}
		r := float64(median(ca.times)) / float64(median(cb.times))
		met := "–" // max 0: no target
		if max > 0 {
			met = yes(r <= max)
		}
		fmt.Fprintf(w, "| %s | %.2f× (%s against %s) | %s |\n", target, r, ms(median(ca.times)), ms(median(cb.times)), met)
	}
	ratio("warm print(45) ≤ 1.0× bare", warmWarmPrint, warmBarePrint, 1.0)
	ratio("warm import numpy, pandas ≤ 0.25× bare", warmWarmImport, warmBareImport, 0.25)
	ratio("plain pool print(45) ≤ 1.2× bare", warmPlainPrint, warmBarePrint, 1.2)
	if *baseline != "" {
		ratio("(no target) -baseline's plain pool print(45) against bare", warmBasePrint, warmBarePrint, 0)
		ratio("(no target) plain pool print(45) against -baseline's", warmPlainPrint, warmBasePrint, 0)
	}
	tput := func(s *loadSubject) float64 {
		if s.err != "" {
			return 0
		}
		return medianF(s.tput[warmK])
	}
	plainT, warmT := tput(ws.load[1]), tput(ws.load[2])
	if plainT > 0 && warmT > 0 && bareTput > 0 {
		fmt.Fprintf(w, "| warm pool runs/s at k=%d ≥ 0.35× bare | %.2f× | %s |\n", warmK, warmT/bareTput, yes(warmT/bareTput >= 0.35))
		fmt.Fprintf(w, "| (no target) warm pool runs/s at k=%d against the plain pool's: a warm fill imports the preloads | %.2f× | – |\n", warmK, warmT/plainT)
	}
}

func yes(ok bool) string { return map[bool]string{true: "yes", false: "no"}[ok] }

func maxOf(d []time.Duration) time.Duration {
	m := d[0]
	for _, v := range d {
		m = max(m, v)
	}
	return m
}
