package backend

import (
	"errors"
	"io"
	"os"
)

// Output is what was kept of one output stream.
type Output struct {
	Data      []byte
	Total     int64 // bytes the program wrote in all
	Truncated bool
}

// OutputFunc receives output as it is kept: stream is "stdout" or
// "stderr", and data is the program's bytes (at most the run's output cap
// per stream in all). It may be called from two goroutines at once, and
// must not keep data.
type OutputFunc func(stream string, data []byte)

// Capture reads r to EOF, keeping at most limit bytes and counting (and
// discarding) the rest, so that a program flooding its output neither
// blocks on a full pipe nor grows agentrun's memory. What it keeps also
// goes to sink, if not nil, as stream. It closes r.
func Capture(r *os.File, limit int64, stream string, sink OutputFunc) Output {
	defer r.Close()
	var out Output
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			out.Total += int64(n)
			if keep := limit - int64(len(out.Data)); keep > 0 {
				kept := buf[:min(int64(n), keep)]
				out.Data = append(out.Data, kept...)
				if sink != nil {
					sink(stream, kept)
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				// A read error ends the stream; what was read is kept.
				out.Truncated = true
			}
			break
		}
	}
	if out.Total > int64(len(out.Data)) {
		out.Truncated = true
	}
	return out
}
