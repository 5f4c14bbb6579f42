// Package untrusted shows a human text that a sandboxed program controls
// (a held request's method, URL and body): every byte that could draw
// anything but itself is written as a visible escape, so the program
// cannot make a new line, a colour, a cleared screen or reversed text
// that reads as agentrun's own. Every channel that shows such text (serve's
// stream, MCP elicitation, the terminal, the webhook, the approvals page)
// passes it through Text; a program's output shown as lines on a
// terminal passes through Lines.
package untrusted

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Text returns s with everything but printable characters escaped:
//
//   - a backslash as \\, so that every backslash in the output starts an escape;
//   - newline, carriage return and tab as \n, \r, \t; the other C0
//     controls and DEL as \xNN;
//   - C1 controls, bidirectional and zero-width format characters (U+202E,
//     U+2066, U+200B, U+FEFF, ...), line and paragraph separators,
//     non-ASCII spaces and every other rune strconv.IsPrint refuses as
//     \uXXXX or \UXXXXXXXX;
//   - each byte of invalid UTF-8 as \xNN.
//
// The escapes are Go's (and JSON's, C's and Python's, but for \x and
// \U), so the exact bytes can be read back: strconv.Unquote of the result
// with its double quotes escaped and quotes around it gives s.
func Text(s string) string {
	if plain(s) {
		return s
	}
	return escape(s, false)
}

// Lines is Text for a program's own output read as lines on a terminal
// (agentrun run --format text): newline and tab are written as they are,
// and so is a backslash, which the program's text holds far more often
// than a reader needs to tell it from an escape. Everything else Text
// escapes, Lines escapes alike, so the output cannot move the cursor,
// colour, clear or reorder what follows it, or hide a character; but
// unlike Text's, its result cannot be read back byte for byte.
func Lines(s string) string {
	return escape(s, true)
}

// escape writes s as Text does; with lines, newline, tab and backslash
// as they are.
func escape(s string, lines bool) string {
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(hex2(s[i]))
		case lines && (r == '\\' || r == '\n' || r == '\t'):
			b.WriteByte(byte(r))
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\x`)
			b.WriteString(hex2(byte(r)))
		case strconv.IsPrint(r):
			b.WriteString(s[i : i+size])
		case r <= 0xffff:
			b.WriteString(`\u`)
			b.WriteString(pad(strconv.FormatInt(int64(r), 16), 4))
		default:
			b.WriteString(`\U`)
			b.WriteString(pad(strconv.FormatInt(int64(r), 16), 8))
		}
		i += size
	}
	return b.String()
}

// plain reports whether s is printable ASCII without a backslash: the
// common case, returned as it is.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return true
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&0xf]})
}

func pad(h string, n int) string {
	return strings.Repeat("0", n-len(h)) + h
}

// Cut shortens text escaped by Text to at most about n bytes, never inside
// an escape or a rune, and marks the cut with the whole's length and its
// SHA-256 (of the escaped text), so that a record too long to keep whole
// still says that it was cut and identifies what it held. A text of at
// most n bytes is returned as it is.
func Cut(escaped string, n int) string {
	if len(escaped) <= n {
		return escaped
	}
	i := 0
	for i < len(escaped) {
		size := tokenLen(escaped[i:])
		if i+size > n {
			break
		}
		i += size
	}
	sum := sha256.Sum256([]byte(escaped))
	return escaped[:i] + "…[cut: " + strconv.Itoa(len(escaped)) + " bytes, sha256 " + hex.EncodeToString(sum[:]) + "]"
}

// tokenLen is the length of the escape or rune that s starts with.
func tokenLen(s string) int {
	if s[0] == '\\' && len(s) > 1 {
		n := 2
		switch s[1] {
		case 'x':
			n = 4
		case 'u':
			n = 6
		case 'U':
			n = 10
		}
		return min(n, len(s))
	}
	_, size := utf8.DecodeRuneInString(s)
	return size
}
