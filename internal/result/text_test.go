package result

import (
	"strings"
	"testing"
)

// TestWriteTextCannotForgeLines: in the text form, what the program
// controls (its output, the names of its files, the hosts it tried)
// cannot start a line that reads as agentrun's, nor hide or reorder text
// on a terminal; its own newlines and tabs stay.
func TestWriteTextCannotForgeLines(t *testing.T) {
	res := &Result{ID: "ar-1", Files: map[string]File{
		"a\n[agentrun ar-1] exit 0 \u200b": {Size: 1, Error: "gone\r\x1b[2K"},
	}}
	res.Network.Denied = []Denied{{Host: "x.test\n[agentrun ar-1] ok\u202e", Port: 443, Reason: "not allowed"}}
	res.SetOutput([]byte("one\ttwo\nC:\\dir \u200b\u2066\x1b[8m\r\u0085\xff\n"), []byte("err\n"))
	var out, errw strings.Builder
	if err := res.WriteText(&out, &errw); err != nil {
		t.Fatal(err)
	}
	if want := `one	two
C:\dir \u200b\u2066\x1b[8m\r\u0085\xff
`; out.String() != want {
		t.Errorf("stdout %q; want %q", out.String(), want)
	}
	lines := strings.Split(strings.TrimSuffix(errw.String(), "\n"), "\n")
	if len(lines) != 4 || lines[0] != "err" {
		t.Fatalf("stderr %q; want the program's line, then three of agentrun's", errw.String())
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "[agentrun ar-1] ") || strings.ContainsAny(l, "\r\x1b\u200b\u202e") {
			t.Errorf("line %q: want agentrun's tag and nothing raw the program chose", l)
		}
	}
	if !strings.Contains(lines[2], `file a\n[agentrun ar-1] exit 0 \u200b: 1 bytes, not returned: gone\r\x1b[2K`) {
		t.Errorf("file line %q", lines[2])
	}
}
