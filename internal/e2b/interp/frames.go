package interp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agentrun/agentrun/internal/jsonkeys"
)

// MaxFrame bounds one frame of a context's interpreter, its newline
// included: a figure's PNG in base64 fits, and a longer line is dropped
// whole (counted), never kept.
const MaxFrame = 8 << 20

// Frame is one frame of a context's interpreter (agentrun_repl.py):
// one JSON object on a line of its stdout.
type Frame struct {
	// T is the frame's type: ready, stdout, stderr, result, error, done.
	T string `json:"t"`
	// Cell is the cell it belongs to; 0 between cells.
	Cell int `json:"cell"`
	// Text is a stdout or stderr frame's output.
	Text string `json:"text"`
	// Main and Bundle are a result's: whether it is the cell's last
	// expression's value, and its MIME bundle.
	Main   bool              `json:"main"`
	Bundle map[string]string `json:"bundle"`
	// Name, Value and Traceback are an error's.
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
	// Count is a done frame's execution count.
	Count int `json:"count"`
}

// frameTypes are the frame types there are.
var frameTypes = map[string]bool{"ready": true, "stdout": true, "stderr": true, "result": true, "error": true, "done": true}

// ParseFrame reads one line as a frame: a JSON object of Frame's fields,
// no key twice (jsonkeys, letter case folded), no field of another
// type, and a type there is. The interpreter is the sandbox's: the line
// is hostile.
func ParseFrame(line []byte) (*Frame, error) {
	if len(line) > MaxFrame {
		return nil, fmt.Errorf("a frame of %d bytes: past the bound of %d", len(line), MaxFrame)
	}
	if err := jsonkeys.Check(line); err != nil {
		return nil, fmt.Errorf("a frame: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var f Frame
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("a frame: %w", err)
	}
	if dec.More() {
		return nil, errors.New("a frame: more than one JSON value on its line")
	}
	if !frameTypes[f.T] {
		return nil, fmt.Errorf("a frame of unknown type %q", truncate(f.T, 32))
	}
	return &f, nil
}

// keepBuf is the most of a Splitter's buffer kept once its line is read.
const keepBuf = 64 << 10

// Splitter cuts an interpreter's output into lines, each at most
// MaxFrame: a longer one is skipped up to its newline and counted in
// Dropped. It holds at most MaxFrame bytes.
type Splitter struct {
	buf  []byte
	skip bool // in a line past the bound, until its newline
	// Dropped counts the lines skipped, too long, and those cut by a
	// Resync.
	Dropped int
}

// Write adds output, calling line with each line it completes (without
// its newline; empty lines are left out). line must not keep its
// argument.
func (s *Splitter) Write(data []byte, line func([]byte)) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		chunk := data
		if i >= 0 {
			chunk = data[:i]
		}
		if !s.skip {
			if len(s.buf)+len(chunk) >= MaxFrame {
				s.skip = true
				s.buf = nil
				s.Dropped++
			} else {
				s.buf = append(s.buf, chunk...)
			}
		}
		if i < 0 {
			return
		}
		if !s.skip && len(s.buf) > 0 {
			line(s.buf)
		}
		s.buf, s.skip = s.buf[:0], false
		if cap(s.buf) > keepBuf {
			s.buf = nil // a large frame's buffer is not kept between frames
		}
		data = data[i+1:]
	}
}

// Resync drops the part of a line read so far: output was lost before
// what comes next (the process's kept output dropped some), so the next
// whole line begins after the next newline.
func (s *Splitter) Resync() {
	s.Dropped++
	s.buf, s.skip = nil, true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
