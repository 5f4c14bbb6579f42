package mcpserver

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestYieldClamped(t *testing.T) {
	n := func(v int) *int { return &v }
	for _, c := range []struct {
		ms   *int
		want time.Duration
	}{
		{nil, DefaultYieldMS * time.Millisecond},
		{n(-5), 0},
		{n(0), 0},
		{n(250), 250 * time.Millisecond},
		{n(1 << 40), MaxYieldMS * time.Millisecond},
	} {
		if got := yield(c.ms); got != c.want {
			t.Errorf("yield(%v) = %v; want %v", c.ms, got, c.want)
		}
	}
}

// Output past the bound keeps its first and last halves, counts the
// bytes between, and stays valid UTF-8 where a character was cut.
func TestCappedOutput(t *testing.T) {
	var c cappedOutput
	c.write("small")
	if c.String() != "small" || c.cut != 0 {
		t.Errorf("under the bound: %q, %d cut", c.String(), c.cut)
	}
	c = cappedOutput{}
	c.write("<" + strings.Repeat("é", MaxShellOutput) + ">")
	s := c.String()
	if !strings.HasPrefix(s, "<é") || !strings.HasSuffix(s, "é>") || !strings.Contains(s, "[…]") {
		t.Errorf("kept %q…%q", s[:8], s[len(s)-8:])
	}
	if total := 2*MaxShellOutput + 2; c.cut != int64(total-MaxShellOutput) || len(c.head)+len(c.tail) != MaxShellOutput {
		t.Errorf("%d kept, %d cut, of %d", len(c.head)+len(c.tail), c.cut, total)
	}
	if !utf8.ValidString(s) {
		t.Error("not valid UTF-8")
	}
	for range 100 {
		c.write(strings.Repeat("x", 1000))
	}
	if !strings.HasSuffix(c.String(), "xxx") || len(c.tail) != MaxShellOutput/2 {
		t.Errorf("later writes: tail of %d bytes", len(c.tail))
	}
}
