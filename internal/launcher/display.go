package launcher

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/safefs"
)

// agentrun reads the display channel, the file displayFile of the
// display directory, as the program's own words (DisplayReader): bounded,
// each line checked, what is not a bundle dropped, never failing the run.
// It reads it once the program has ended, and also while it runs when
// the run's door shows each display bundle as it comes (the stream).

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

// displayPoll is how often a run whose door shows display bundles as
// they come (runapi.Hooks.Display) looks at its display channel.
const displayPoll = 50 * time.Millisecond

// DisplayReader reads a run's display channel (the file displayFile of
// its display directory) line by line, as the program writes
// it or once at its end, within the same bounds either way: the bundles'
// data (each MIME type and string) counts against budget bytes in the
// channel's order, a later value replacing an earlier one (whose bytes
// count no longer), and at most MaxDisplay display bundles are kept. A
// bundle past either bound, a line that is not a bundle and bytes past
// maxDisplayChannel count as dropped. It is used by one goroutine at a
// time.
type DisplayReader struct {
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

// NewDisplayReader is the reader of the display directory dir (nil for a
// run without one), keeping budget bytes of bundles and calling emit, if
// not nil, with each display bundle kept.
func NewDisplayReader(dir *safefs.Dir, budget int64, emit func(map[string]string)) *DisplayReader {
	return &DisplayReader{dir: dir, budget: budget, emit: emit}
}

// Watch reads the channel every displayPoll while the program runs, so
// that emit gets each bundle as it comes; the function it returns stops
// it and waits until it has. Without emit or a channel it does nothing.
func (d *DisplayReader) Watch() (stop func()) {
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
func (d *DisplayReader) poll() {
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
func (d *DisplayReader) take(line []byte) {
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

// Finish reads the rest of the channel, the program having ended (a last
// line without its newline counts), and fills res's Value, Display and
// DisplayDropped.
func (d *DisplayReader) Finish(res *result.Result) {
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
