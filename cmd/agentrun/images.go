package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/docker/go-units"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/config"
)

// storeFlags are the flags every image command takes.
type storeFlags struct {
	fs     *flag.FlagSet
	config *string
	store  *string
}

func newStoreFlags(name string, stderr io.Writer) *storeFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &storeFlags{
		fs:     fs,
		config: fs.String("config", "", "config file (default "+config.DefaultPath+")"),
		store:  fs.String("store", "", "image store directory (default: the config's store_dir)"),
	}
}

// open loads the config and opens the store it names (or --store).
func (f *storeFlags) open() (*image.Store, error) {
	dir := *f.store
	if dir == "" || *f.config != "" {
		cfg, err := config.Load(*f.config)
		if err != nil {
			return nil, err
		}
		if dir == "" {
			dir = cfg.StoreDir
		}
	}
	return image.Open(dir)
}

// cmdPull pulls REF into the store, even if it is there already, and prints
// "REF DIGEST". It shows progress only when stdout is a terminal.
func cmdPull(args []string, stdout, stderr io.Writer) int {
	f := newStoreFlags("pull", stderr)
	if err := f.fs.Parse(args); err != nil {
		return 2
	}
	if f.fs.NArg() != 1 {
		fmt.Fprintln(stderr, "agentrun pull: exactly one image reference is required")
		return 2
	}
	s, err := f.open()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun pull: %s\n", oneLine(err))
		return 1
	}
	var opts image.PullOptions
	if isTerminal(stdout) {
		opts.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	img, err := s.Pull(ctx, f.fs.Arg(0), opts)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun pull: %s\n", oneLine(err))
		return 1
	}
	fmt.Fprintf(stdout, "%s %s\n", img.Ref, img.Digest)
	return 0
}

// imageJSON is one line of `agentrun images --json`.
type imageJSON struct {
	Ref      string    `json:"ref"`
	Digest   string    `json:"digest"`
	Size     int64     `json:"size"`
	LastUsed time.Time `json:"last_used"`
}

// cmdImages lists the store's references.
func cmdImages(args []string, stdout, stderr io.Writer) int {
	f := newStoreFlags("images", stderr)
	asJSON := f.fs.Bool("json", false, "print a JSON array instead of a table")
	if err := f.fs.Parse(args); err != nil || f.fs.NArg() != 0 {
		return 2
	}
	s, err := f.open()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun images: %s\n", oneLine(err))
		return 1
	}
	entries, err := s.List()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun images: %s\n", oneLine(err))
		return 1
	}
	if *asJSON {
		out := make([]imageJSON, 0, len(entries))
		for _, e := range entries {
			out = append(out, imageJSON{Ref: e.Ref, Digest: e.Digest, Size: e.Size, LastUsed: e.LastUsed})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "agentrun images: %s\n", oneLine(err))
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "REFERENCE\tDIGEST\tSIZE\tLAST USED")
	now := time.Now()
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Ref, shortDigest(e.Digest), units.BytesSize(float64(e.Size)), ago(now, e.LastUsed))
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "agentrun images: %s\n", oneLine(err))
		return 1
	}
	return 0
}

// cmdRmi removes references (and their images when no other reference
// uses them). It goes on past a failure and then exits 1.
func cmdRmi(args []string, stdout, stderr io.Writer) int {
	f := newStoreFlags("rmi", stderr)
	if err := f.fs.Parse(args); err != nil {
		return 2
	}
	if f.fs.NArg() == 0 {
		fmt.Fprintln(stderr, "agentrun rmi: at least one image reference is required")
		return 2
	}
	s, err := f.open()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun rmi: %s\n", oneLine(err))
		return 1
	}
	code := 0
	for _, ref := range f.fs.Args() {
		if err := s.Remove(ref); err != nil {
			fmt.Fprintf(stderr, "agentrun rmi: %s\n", oneLine(err))
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "removed %s\n", ref)
	}
	return code
}

// cmdPrune removes images no reference uses and what interrupted pulls
// left, and prints the images it removed.
func cmdPrune(args []string, stdout, stderr io.Writer) int {
	f := newStoreFlags("prune", stderr)
	if err := f.fs.Parse(args); err != nil || f.fs.NArg() != 0 {
		return 2
	}
	s, err := f.open()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun prune: %s\n", oneLine(err))
		return 1
	}
	removed, err := s.Prune(context.Background())
	var total int64
	for _, e := range removed {
		fmt.Fprintf(stdout, "removed %s (%s)\n", e.Digest, units.BytesSize(float64(e.Size)))
		total += e.Size
	}
	if err != nil {
		fmt.Fprintf(stderr, "agentrun prune: %s\n", oneLine(err))
		return 1
	}
	fmt.Fprintf(stdout, "%d images removed, %s freed\n", len(removed), units.BytesSize(float64(total)))
	return 0
}

// oneLine is err's message on one line: registries may put newlines in
// the bodies that errors quote.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// shortDigest is "sha256:" and the first 12 hex digits.
func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok || len(hex) <= 12 {
		return d
	}
	return algo + ":" + hex[:12]
}

// ago says how long before now t was, coarsely.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return plural(int(d/time.Minute), "minute") + " ago"
	case d < 48*time.Hour:
		return plural(int(d/time.Hour), "hour") + " ago"
	default:
		return plural(int(d/(24*time.Hour)), "day") + " ago"
	}
}

func plural(n int, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}
