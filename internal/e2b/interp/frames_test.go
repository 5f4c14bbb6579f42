package interp

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestParseFrame: a frame is one JSON object of the frame's fields and a
// type there is; a key twice (in any letter case), an unknown field, a
// field of another type, a second value, a frame past MaxFrame and text
// that is not JSON are refused.
func TestParseFrame(t *testing.T) {
	f, err := ParseFrame([]byte(`{"t": "result", "cell": 3, "main": true, "bundle": {"text/plain": "2", "image/png": "iVBO"}}`))
	if err != nil || f.T != "result" || f.Cell != 3 || !f.Main || f.Bundle["text/plain"] != "2" || f.Bundle["image/png"] != "iVBO" {
		t.Fatalf("a result: %+v, %v", f, err)
	}
	f, err = ParseFrame([]byte(`{"t": "error", "cell": 1, "name": "E", "value": "v", "traceback": "tb"}`))
	if err != nil || f.Name != "E" || f.Value != "v" || f.Traceback != "tb" {
		t.Fatalf("an error: %+v, %v", f, err)
	}
	for _, bad := range []string{
		`{"t": "result", "cell": 1, "cell": 2}`,
		`{"t": "result", "cell": 1, "Cell": 2}`,
		`{"t": "result", "bundle": {"text/plain": "a", "text/plain": "b"}}`,
		`{"t": "result", "extra": 1}`,
		`{"t": "result", "cell": "1"}`,
		`{"t": "result", "bundle": {"text/plain": 1}}`,
		`{"t": "pwned"}`,
		`{"t": "done"} {"t": "done"}`,
		`{"t": "done"`,
		`not json`,
		`["t", "done"]`,
		`{"t": "stdout", "text": "` + strings.Repeat("a", MaxFrame) + `"}`,
	} {
		if f, err := ParseFrame([]byte(bad)); err == nil {
			t.Errorf("%.80s: read as %+v", bad, f)
		}
	}
}

// TestSplitter: lines are cut at newlines across writes, empty ones left
// out; a line past MaxFrame is dropped whole, counted, and the next line
// read; after a Resync the part read so far is dropped and the next line
// starts after the next newline.
func TestSplitter(t *testing.T) {
	var s Splitter
	var got []string
	line := func(b []byte) { got = append(got, string(b)) }
	s.Write([]byte("\n{\"a\""), line)
	s.Write([]byte(": 1}\n\n{\"b\": 2}\n{\"c"), line)
	if want := []string{`{"a": 1}`, `{"b": 2}`}; !equal(got, want) {
		t.Fatalf("lines %q; want %q", got, want)
	}
	got = nil
	big := bytes.Repeat([]byte("x"), MaxFrame/4)
	for range 5 {
		s.Write(big, line)
	}
	s.Write([]byte("tail\nnext\n"), line)
	if want := []string{"next"}; !equal(got, want) || s.Dropped != 1 {
		t.Fatalf("after a line past the bound: %q (dropped %d); want %q", got, s.Dropped, want)
	}
	if len(s.buf) != 0 || cap(s.buf) > keepBuf {
		t.Errorf("the splitter holds %d bytes (cap %d)", len(s.buf), cap(s.buf))
	}
	s.Write(append(bytes.Repeat([]byte("y"), MaxFrame/2), '\n'), line)
	if len(got) != 2 || len(got[1]) != MaxFrame/2 || cap(s.buf) > keepBuf {
		t.Errorf("after a large line: %d lines, the buffer's cap %d", len(got), cap(s.buf))
	}
	got = nil
	s.Write([]byte(`{"t": "res`), line)
	s.Resync()
	s.Write([]byte(`ult"}`+"\n"+`{"t": "done"}`+"\n"), line)
	if want := []string{`{"t": "done"}`}; !equal(got, want) || s.Dropped != 2 {
		t.Fatalf("after a resync: %q (dropped %d); want %q", got, s.Dropped, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestResult: a bundle becomes E2B's result message: the formats E2B
// names, text without a string repr's quotes, json as the JSON it holds
// (left out where it is not JSON or holds a key twice), other MIME types
// left out.
func TestResult(t *testing.T) {
	m := Result(true, map[string]string{"text/plain": "'abc'", "text/html": "<b>", "image/png": "iVBO",
		"application/json": `{"k": [1]}`, "application/x-evil": "x", "image/svg+xml": "<svg/>"})
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"html":"\u003cb\u003e","is_main_result":true,"json":{"k":[1]},"png":"iVBO","svg":"\u003csvg/\u003e","text":"abc","type":"result"}`
	if string(b) != want {
		t.Errorf("result %s;\nwant %s", b, want)
	}
	for _, bad := range []string{`{"k": 1, "k": 2}`, `{"k": `} {
		if m := Result(false, map[string]string{"application/json": bad}); m["json"] != nil {
			t.Errorf("json %q kept: %v", bad, m["json"])
		}
	}
	if m := Result(false, map[string]string{"text/plain": "'"}); m["text"] != "'" {
		t.Errorf("a lone quote: %q", m["text"])
	}
}

// FuzzFrames: whatever an interpreter prints, the splitter holds at most
// MaxFrame bytes and every line it gives is at most that, and a frame
// read from a line is one of the types there are.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("\n{\"t\": \"ready\"}\n"), 3)
	f.Add([]byte("{\"t\": \"result\", \"cell\": 1, \"bundle\": {\"text/plain\": \"1\"}}\n{\"t\": \"done\", \"cell\": 1}\n"), 7)
	f.Add([]byte("{\"t\": \"stdout\", \"text\": \"\\u0000\\n\"}\n"), 1)
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		var s Splitter
		if cut < 0 {
			cut = -cut
		}
		cut %= len(data) + 1
		for _, part := range [][]byte{data[:cut], data[cut:]} {
			s.Write(part, func(line []byte) {
				if len(line) >= MaxFrame || len(line) == 0 {
					t.Fatalf("a line of %d bytes", len(line))
				}
				if fr, err := ParseFrame(line); err == nil && !frameTypes[fr.T] {
					t.Fatalf("a frame of type %q", fr.T)
				}
			})
			if len(s.buf) >= MaxFrame {
				t.Fatalf("the splitter holds %d bytes", len(s.buf))
			}
		}
	})
}

// TestBashStream: a bash cell's output is all before its mark, the mark
// split across chunks too, with at most the mark's length held back; the
// status after it is read when it comes in later chunks, and what comes
// after is kept within a bound.
func TestBashStream(t *testing.T) {
	const mark = "AGENTRUN_0123_7_"
	var b bashStream
	var got strings.Builder
	for _, chunk := range []string{"hello ", "wor", "ld\nAGENT", "RUN_0123_", "7_", ":", "3", "\n", strings.Repeat("x", 100)} {
		got.Write(b.take([]byte(chunk), mark))
		if !b.seen && len(b.buf) >= len(mark) {
			t.Fatalf("holds %d bytes back", len(b.buf))
		}
	}
	if got.String() != "hello world\n" || !b.seen {
		t.Fatalf("output %q, seen %v", got.String(), b.seen)
	}
	if st, ok := bashStatus(b.buf); !ok || st != 3 || len(b.buf) > maxStatus {
		t.Errorf("status %d %v, %d bytes kept", st, ok, len(b.buf))
	}
	// Another cell's mark is output.
	var c bashStream
	if out := c.take([]byte("AGENTRUN_0123_17_:0\nAGENTRUN_0123_7_:0\n"), mark); string(out) != "AGENTRUN_0123_17_:0\n" {
		t.Errorf("another cell's mark: %q", out)
	}
}
