package runsc

import (
	"fmt"
	"os"
)

// stdio holds the three pipes between agentrun and the program; runsc hands
// the child ends to the sandbox as the program's stdin, stdout and stderr.
type stdio struct {
	inR, inW, outR, outW, errR, errW *os.File
}

func newStdio() (*stdio, error) {
	var s stdio
	var err error
	if s.inR, s.inW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	if s.outR, s.outW, err = os.Pipe(); err != nil {
		s.closeAll()
		return nil, fmt.Errorf("creating stdout pipe: %w", err)
	}
	if s.errR, s.errW, err = os.Pipe(); err != nil {
		s.closeAll()
		return nil, fmt.Errorf("creating stderr pipe: %w", err)
	}
	return &s, nil
}

// closeChildEnds closes agentrun's copies of the ends runsc now holds, so
// that the output pipes reach EOF when the sandbox's side is gone.
func (s *stdio) closeChildEnds() {
	for _, f := range []*os.File{s.inR, s.outW, s.errW} {
		f.Close()
	}
}

// closeAll closes every end still open; closing twice is harmless.
func (s *stdio) closeAll() {
	for _, f := range []*os.File{s.inR, s.inW, s.outR, s.outW, s.errR, s.errW} {
		if f != nil {
			f.Close()
		}
	}
}

// feed writes data to the program's stdin and closes it. A program that
// exits without reading makes the write fail with EPIPE, which ends feed.
func feed(w *os.File, data []byte) {
	defer w.Close()
	if len(data) > 0 {
		_, _ = w.Write(data)
	}
}
