package main

import (
	"strconv"
	"testing"
)

// TestPrintableHidesNothing: a session file's name in the listing is
// written as it is only when every character of it is visible on its
// own; a control, a variation selector, a filler or a tag is escaped, and
// the quoted form reads back to the name.
func TestPrintableHidesNothing(t *testing.T) {
	for _, name := range []string{"a.txt", "dir/b c.py", "naïve.md"} {
		if got := printable(name); got != name {
			t.Errorf("printable(%q) = %q, want it as is", name, got)
		}
	}
	for _, name := range []string{
		"a\nb", "x\x1b[2K", "to\ufe0f", "\u3164name", "tag\U000E0041", "vs\U000E0100",
		"rtl\u202etxt", `q"uote` + "\u200b", `back\slash` + "\u2066",
	} {
		got := printable(name)
		back, err := strconv.Unquote(got)
		if err != nil || back != name {
			t.Errorf("printable(%q) = %s: reads back as %q, %v", name, got, back, err)
		}
		for _, r := range got {
			if r > 0x7e || r < 0x20 {
				t.Errorf("printable(%q) = %s holds %U raw", name, got, r)
			}
		}
	}
}
