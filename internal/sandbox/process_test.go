package sandbox

import (
	"context"
	"encoding/base64"
	"testing"
)

// A process keeps at most its limit of output, the newest, and counts
// what it dropped; output that is not UTF-8 comes as bytes.
func TestProcessOutputBound(t *testing.T) {
	p := newProcess([]string{"x"}, 10)
	p.mu.Lock()
	p.appendLocked(Event{Event: "start", Pid: 7})
	p.mu.Unlock()
	for _, s := range []string{"aaaa", "bbbb", "cccc", "dddddddddddd"} {
		p.output("stdout", []byte(s))
	}
	p.output("stderr", []byte{0xff, 0xfe})
	evs, next, done := p.Next(context.Background(), 0)
	if done {
		t.Error("done before the exit")
	}
	var kept int
	for _, e := range evs {
		kept += int(outputLen(e))
	}
	if kept > 10 {
		t.Errorf("%d bytes kept past the limit of 10: %+v", kept, evs)
	}
	if p.dropped != 4+4+4+12+2-int64(kept) {
		t.Errorf("dropped %d, kept %d", p.dropped, kept)
	}
	last := evs[len(evs)-1]
	if last.Event != "stderr" || last.DataB64 != base64.StdEncoding.EncodeToString([]byte("\xff\xfe")) || last.Data != "" {
		t.Errorf("non-UTF-8 output: %+v", last)
	}
	if next != p.first+len(p.events) {
		t.Errorf("next %d", next)
	}
}

// incompleteTail finds a UTF-8 sequence cut at a read's end.
func TestIncompleteTail(t *testing.T) {
	for in, want := range map[string]int{"ab": 0, "a\xc3": 1, "a\xe2\x82": 2, "a\xe2\x82\xac": 0, "é": 0} {
		if got := incompleteTail([]byte(in)); got != want {
			t.Errorf("incompleteTail(%q) = %d, want %d", in, got, want)
		}
	}
}
