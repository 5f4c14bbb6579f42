package runner

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A Python run shows what a notebook shows: its code's last expression's
// value and each object it displays (display(obj), a matplotlib figure
// shown or left open), as MIME bundles in the result (Value, Display).
// agentrun's run launcher (run.py) runs the code: a cold or pooled run's
// program is the launcher, put before the code file in the language's
// argv, and a warm run's launcher (warm.py) runs the code through it. The
// launcher writes each bundle as a JSON line into a file of the sandbox's
// display directory, a small tmpfs of the run's own; agentrun reads it as
// the program's own words (displayReader): bounded, each line checked,
// what is not a bundle dropped, never failing the run. It reads it once
// the program has ended, and also while it runs when the run's door shows
// each display bundle as it comes (the stream).

//go:embed run.py
var runLauncher []byte

// runLib is the rest of the run launcher, which it compiles only where a
// run needs it (a value shown, a figure, an uncaught exception): Python
// compiles a program's file at every start, and this is most of the
// launcher.
//
//go:embed runlib.py
var runLib []byte

// RunLauncherPath is where the run launcher is mounted, read-only, in the
// sandbox's own /dev tmpfs, as the warm launcher is; its source is the
// run's etc tmpfs (writeEtc), under runLauncherName.
const RunLauncherPath = "/dev/agentrun-run.py"

const runLauncherName = "agentrun-run.py"

// RunLibPath is where runlib.py is mounted beside the run launcher; its
// source is the run's etc tmpfs, under runLibName.
const RunLibPath = "/dev/agentrun-runlib.py"

const runLibName = "agentrun-runlib.py"

// DisplayDir is the sandbox's display directory, writable, in its /dev;
// the launcher writes its bundles into displayFile there.
const DisplayDir = "/dev/agentrun-display"

const displayFile = "bundles"

// maxDisplayChannel bounds the display tmpfs: what a program can write
// there, and what agentrun reads of it.
const maxDisplayChannel = 8 << 20

// MaxDisplay is the most display bundles a result holds.
const MaxDisplay = 16

// displayMIME are the MIME types a bundle may hold; images are base64.
var displayMIME = map[string]bool{
	"text/plain": true, "text/html": true, "text/markdown": true, "text/latex": true,
	"image/png": true, "image/jpeg": true, "image/svg+xml": true, "application/json": true,
}

// isPythonName reports whether name is that of a Python interpreter:
// python, python3, python3.11 (python, then digits, then a dot and digits).
// Checked byte by byte: a regular expression would be compiled at package
// init, in every container's init too (agentrun re-executed).
func isPythonName(name string) bool {
	v, ok := strings.CutPrefix(name, "python")
	if !ok {
		return false
	}
	if v == "" {
		return true
	}
	major, minor, dotted := strings.Cut(v, ".")
	return digits(major) && (!dotted || digits(minor))
}

// digits reports whether s is one or more of 0-9.
func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// launcherArgv is p's argv with the run launcher's start before its code file,
// when p runs the code file of Python code with a Python interpreter:
// "python3 [OPTION...] /workspace/main.py [ARG...]", as the Python
// languages' argv makes it, where every option starts with "-" and is not
// -c or -m; nil for any other program. It reads the argv alone, as a
// pooled sandbox's shape does (a bare plan has no code file).
func launcherArgv(p *task.Plan) []string {
	if len(p.Argv) < 2 || !isPythonName(path.Base(p.Argv[0])) {
		return nil
	}
	file := spec.WorkspaceDir + "/" + task.CodeFileName("python")
	for i, a := range p.Argv[1:] {
		switch {
		case a == file:
			return slices.Concat(p.Argv[:i+1], []string{RunStartPath}, p.Argv[i+1:])
		case !strings.HasPrefix(a, "-") || a == "-c" || a == "-m" || a == "-":
			return nil
		}
	}
	return nil
}

// launcherFiles writes the run launcher, its start and, if not nil, its
// bytecode code (launchcode.go) into the run's etc tmpfs of run dir dir,
// and returns their spec options.
func launcherFiles(dir string, code []byte, undo *cleanup.Cleanup) ([]spec.SpecOpt, error) {
	files := []struct {
		name, at string
		data     []byte
	}{{runLauncherName, RunLauncherPath, runLauncher}, {runStartName, RunStartPath, runStart}, {runCodeName, RunCodePath, code}}
	var opts []spec.SpecOpt
	for _, f := range files {
		if f.data == nil {
			continue
		}
		path, err := writeEtc(dir, undo, f.name, f.data)
		if err != nil {
			return nil, fmt.Errorf("writing the run launcher: %w", err)
		}
		opts = append(opts, spec.WithReadonlyFile(path, f.at))
	}
	return opts, nil
}

// values sets up what shows a run's values in the sandbox of run dir
// dir, whose processes run as uid: the run launcher (with code, its
// bytecode, if not nil), from the run's etc tmpfs, and the display
// directory, a tmpfs of maxDisplayChannel owned by uid at dir/display;
// with the state module and st's request (not nil), or the module alone
// (withState: a warm sandbox). It returns their spec options and the
// display directory, held open (safefs: the sandbox writes in it).
func values(dir string, uid int, st *stateRequest, withState bool, code []byte, undo *cleanup.Cleanup) ([]spec.SpecOpt, *safefs.Dir, error) {
	specOpts, err := launcherFiles(dir, code, undo)
	if err != nil {
		return nil, nil, err
	}
	lib, err := writeEtc(dir, undo, runLibName, runLib)
	if err != nil {
		return nil, nil, fmt.Errorf("writing the run launcher: %w", err)
	}
	display := filepath.Join(dir, "display")
	if err := os.Mkdir(display, 0o700); err != nil {
		return nil, nil, fmt.Errorf("creating the run's display tmpfs: %w", err)
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=16,mode=0700,uid=%d,gid=%d", maxDisplayChannel, uid, uid)
	if err := unix.Mount("tmpfs", display, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return nil, nil, fmt.Errorf("mounting the run's display tmpfs: %w", err)
	}
	undo.Add(func() error {
		if err := unix.Unmount(display, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting the run's display tmpfs: %w", err)
		}
		return nil
	})
	dd, err := safefs.Open(display)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the run's display tmpfs: %w", err)
	}
	undo.Add(dd.Close)
	specOpts = append(specOpts, spec.WithReadonlyFile(lib, RunLibPath), spec.WithWritableDir(display, DisplayDir))
	if st != nil || withState {
		stateOpt, err := stateModuleOpt(dir, undo)
		if err != nil {
			return nil, nil, err
		}
		specOpts = append(specOpts, stateOpt)
	}
	if st != nil {
		if err := st.write(dd); err != nil {
			return nil, nil, err
		}
	}
	return specOpts, dd, nil
}

// displayPoll is how often a run whose door shows display bundles as
// they come (runapi.Hooks.Display) looks at its display channel.
const displayPoll = 50 * time.Millisecond

// displayReader reads a run's display channel (the file displayFile of
// its display directory) line by line, as the program writes
// it or once at its end, within the same bounds either way: the bundles'
// data (each MIME type and string) counts against budget bytes in the
// channel's order, a later value replacing an earlier one (whose bytes
// count no longer), and at most MaxDisplay display bundles are kept. A
// bundle past either bound, a line that is not a bundle and bytes past
// maxDisplayChannel count as dropped. It is used by one goroutine at a
// time.
type displayReader struct {
	dir     *safefs.Dir
	budget  int64
	emit    func(map[string]string) // each display bundle kept, as it is; may be nil
	read    int64                   // bytes of the channel consumed
	partial []byte                  // the start of a line not yet ended
	value   map[string]string
	valueN  int64
	display []map[string]string
	dropped int
	over    bool
}

// newDisplayReader is the reader of the display directory dir (nil for a
// run without one), keeping budget bytes of bundles and calling emit, if
// not nil, with each display bundle kept.
func newDisplayReader(dir *safefs.Dir, budget int64, emit func(map[string]string)) *displayReader {
	return &displayReader{dir: dir, budget: budget, emit: emit}
}

// watch reads the channel every displayPoll while the program runs, so
// that emit gets each bundle as it comes; the function it returns stops
// it and waits until it has. Without emit or a channel it does nothing.
func (d *displayReader) watch() (stop func()) {
	if d.emit == nil || d.dir == nil {
		return func() {}
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(displayPoll)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				d.poll()
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// poll reads what the program added to the channel since the last poll
// and takes its complete lines: never through a symlink, never blocking
// on a FIFO, only a regular file, at most maxDisplayChannel bytes in all.
// A file that is not there, or not one to read, reads as nothing new.
func (d *displayReader) poll() {
	if d.dir == nil || d.over {
		return
	}
	f, err := d.dir.Open(displayFile)
	if err != nil {
		return
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return
	}
	left := maxDisplayChannel - d.read
	data, err := io.ReadAll(io.NewSectionReader(f, d.read, left+1))
	if err != nil {
		return
	}
	if int64(len(data)) > left {
		// Larger than the tmpfs can be: the rest is not read.
		data, d.over = data[:left], true
		d.dropped++
	}
	d.read += int64(len(data))
	// Only what is new is looked through: a line still being written is
	// not read again at each poll.
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			d.partial = append(d.partial, data...)
			return
		}
		line := append(d.partial, data[:i]...)
		d.partial = nil
		d.take(line)
		data = data[i+1:]
	}
}

// take checks one line of the channel and keeps its bundle if it fits.
func (d *displayReader) take(line []byte) {
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	kind, b, err := parseBundle(line)
	if err != nil {
		d.dropped++
		return
	}
	var n int64
	for k, v := range b {
		n += int64(len(k) + len(v))
	}
	if kind == "value" {
		if d.value != nil {
			d.dropped++ // the last one is the run's
			d.budget += d.valueN
			d.value = nil
		}
		if n > d.budget {
			d.dropped++
			return
		}
		d.value, d.valueN = b, n
		d.budget -= n
		return
	}
	if len(d.display) >= MaxDisplay || n > d.budget {
		d.dropped++
		return
	}
	d.budget -= n
	d.display = append(d.display, b)
	if d.emit != nil {
		d.emit(b)
	}
}

// finish reads the rest of the channel, the program having ended (a last
// line without its newline counts), and fills res's Value, Display and
// DisplayDropped.
func (d *displayReader) finish(res *result.Result) {
	if d.dir == nil {
		return
	}
	d.poll()
	if len(d.partial) > 0 {
		d.take(d.partial)
		d.partial = nil
	}
	res.Value, res.Display, res.DisplayDropped = d.value, d.display, d.dropped
}

// readChannelAt reads the file name of the display directory dir, which
// the program made: never through a link, never blocking on a FIFO, only
// a regular file (safefs), at most max bytes (over says it held more). A
// file that is not there, or not one to read, reads as empty.
func readChannelAt(dir *safefs.Dir, name string, max int64) (data []byte, over bool) {
	f, err := dir.Open(name)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, false
	}
	data, err = readAtMost(f, "the display channel", max)
	if err != nil {
		// Larger than the tmpfs can be, or unreadable: what was read of
		// it is not kept.
		return nil, true
	}
	return data, false
}

// parseBundle parses one line of the display channel: a JSON object with
// one key, "value" or "display", whose value is a bundle, an object of
// strings under known MIME types (images as base64).
func parseBundle(line []byte) (string, map[string]string, error) {
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(line, &rec); err != nil {
		return "", nil, err
	}
	if len(rec) != 1 {
		return "", nil, fmt.Errorf("%d keys, not one", len(rec))
	}
	var kind string
	var raw json.RawMessage
	for kind, raw = range rec {
	}
	if kind != "value" && kind != "display" {
		return "", nil, fmt.Errorf("unknown kind %q", kind)
	}
	var b map[string]string
	if err := json.Unmarshal(raw, &b); err != nil {
		return "", nil, err
	}
	if len(b) == 0 {
		return "", nil, fmt.Errorf("empty bundle")
	}
	for mime, v := range b {
		if !displayMIME[mime] {
			return "", nil, fmt.Errorf("unknown MIME type %q", mime)
		}
		if mime == "image/png" || mime == "image/jpeg" {
			if _, err := base64.StdEncoding.DecodeString(v); err != nil {
				return "", nil, fmt.Errorf("%s is not base64: %w", mime, err)
			}
		}
	}
	return kind, b, nil
}
