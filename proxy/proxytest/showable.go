package proxytest

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Unshowable says what in s could draw anything but itself on a terminal
// or a page (a C0 control, newline included, DEL, a C1 control, a format
// character such as U+202E or U+200B, invalid UTF-8), or "" when nothing
// does: the check of text a sandboxed program controls, as shown to a
// human.
func Unshowable(s string) string {
	if !utf8.ValidString(s) {
		return "invalid UTF-8"
	}
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
			return fmt.Sprintf("%U", r)
		}
	}
	return ""
}
