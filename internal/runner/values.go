package runner

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/result"
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
// display directory, a small tmpfs of the run's own; agentrun reads it
// once the program has ended as the program's own words: bounded, each
// line checked, what is not a bundle dropped, never failing the run.

//go:embed run.py
var runLauncher []byte

// RunLauncherPath is where the run launcher is mounted, read-only, in the
// sandbox's own /dev tmpfs, as the warm launcher is; its source is the
// run's etc tmpfs (writeEtc), under runLauncherName.
const RunLauncherPath = "/dev/agentrun-run.py"

const runLauncherName = "agentrun-run.py"

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

// pythonName is the name of a Python interpreter: python, python3,
// python3.11.
var pythonName = regexp.MustCompile(`^python([0-9]+(\.[0-9]+)?)?$`)

// launcherArgv is p's argv with the run launcher before its code file,
// when p runs the code file of Python code with a Python interpreter:
// "python3 [OPTION...] /workspace/main.py [ARG...]", as the Python
// languages' argv makes it, where every option starts with "-" and is not
// -c or -m; nil for any other program. It reads the argv alone, as a
// pooled sandbox's shape does (a bare plan has no code file).
func launcherArgv(p *task.Plan) []string {
	if len(p.Argv) < 2 || !pythonName.MatchString(path.Base(p.Argv[0])) {
		return nil
	}
	file := spec.WorkspaceDir + "/" + task.CodeFileName("python")
	for i, a := range p.Argv[1:] {
		switch {
		case a == file:
			return slices.Concat(p.Argv[:i+1], []string{RunLauncherPath}, p.Argv[i+1:])
		case !strings.HasPrefix(a, "-") || a == "-c" || a == "-m" || a == "-":
			return nil
		}
	}
	return nil
}

// values sets up what shows a run's values in the sandbox of run dir
// dir, whose processes run as uid: the run launcher, from the run's etc
// tmpfs, and the display directory, a tmpfs of maxDisplayChannel owned
// by uid at dir/display. It returns their spec options and the display
// directory's host path.
func values(dir string, uid int, st *stateRequest, undo *cleanup.Cleanup) ([]spec.SpecOpt, string, error) {
	launcher, err := writeEtc(dir, undo, runLauncherName, runLauncher)
	if err != nil {
		return nil, "", fmt.Errorf("writing the run launcher: %w", err)
	}
	display := filepath.Join(dir, "display")
	if err := os.Mkdir(display, 0o700); err != nil {
		return nil, "", fmt.Errorf("creating the run's display tmpfs: %w", err)
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=16,mode=0700,uid=%d,gid=%d", maxDisplayChannel, uid, uid)
	if err := unix.Mount("tmpfs", display, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return nil, "", fmt.Errorf("mounting the run's display tmpfs: %w", err)
	}
	undo.Add(func() error {
		if err := unix.Unmount(display, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting the run's display tmpfs: %w", err)
		}
		return nil
	})
	specOpts := []spec.SpecOpt{spec.WithReadonlyFile(launcher, RunLauncherPath), spec.WithWritableDir(display, DisplayDir)}
	if st != nil {
		stateOpt, err := st.write(dir, display, undo)
		if err != nil {
			return nil, "", err
		}
		specOpts = append(specOpts, stateOpt)
	}
	return specOpts, display, nil
}

// readValues fills res's Value, Display and DisplayDropped from what the
// program left in its display directory dir (a host path; "" for a run
// without one). The bundles' data (each MIME type and string) is kept up
// to budget bytes in all, the value first and then each display bundle
// in order, at most MaxDisplay of these; a bundle past either bound, a
// line that is not a bundle and a channel past its bound count in
// DisplayDropped.
func readValues(dir string, budget int64, res *result.Result) {
	if dir == "" {
		return
	}
	data, over := readChannel(filepath.Join(dir, displayFile))
	var value map[string]string
	var display []map[string]string
	dropped := 0
	if over {
		dropped++
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		kind, b, err := parseBundle(line)
		switch {
		case err != nil:
			dropped++
		case kind == "value":
			if value != nil {
				dropped++ // the last one is the run's
			}
			value = b
		default:
			display = append(display, b)
		}
	}
	fits := func(b map[string]string) bool {
		var n int64
		for k, v := range b {
			n += int64(len(k) + len(v))
		}
		if n > budget {
			return false
		}
		budget -= n
		return true
	}
	if value != nil {
		if fits(value) {
			res.Value = value
		} else {
			dropped++
		}
	}
	for _, b := range display {
		if len(res.Display) < MaxDisplay && fits(b) {
			res.Display = append(res.Display, b)
		} else {
			dropped++
		}
	}
	res.DisplayDropped = dropped
}

// readChannel reads the display file at name, which the program made:
// never through a symlink, never blocking on a FIFO, only a regular file,
// at most maxDisplayChannel bytes (over says it held more). A file that
// is not there, or not one to read, reads as empty.
func readChannel(name string) (data []byte, over bool) {
	return readChannelAt(name, maxDisplayChannel)
}

// readChannelAt is readChannel with a bound of max bytes.
func readChannelAt(name string, max int64) (data []byte, over bool) {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), name)
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
