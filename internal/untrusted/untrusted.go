// Package untrusted shows a human text that a sandboxed program controls
// (a held request's method, URL and body): every byte that could draw
// anything but itself is written as a visible escape, so the program
// cannot make a new line, a colour, a cleared screen or reversed text
// that reads as agentrun's own, nor hide a character (a variation
// selector, a Hangul filler, a tag, a stack of combining marks) in what
// the human approves. Every channel that shows such text (serve's
// stream, MCP elicitation, the terminal, the webhook, the approvals page)
// passes it through Text; a program's output shown as lines on a
// terminal passes through Lines.
package untrusted

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text returns s with every character that is not visible on its own
// escaped:
//
//   - a backslash as \\, so that every backslash in the output starts an escape;
//   - newline, carriage return and tab as \n, \r, \t; the other C0
//     controls and DEL as \xNN;
//   - each byte of invalid UTF-8 as \xNN;
//   - as \uXXXX or \UXXXXXXXX, every rune that is not visible on its
//     own (C1 controls, format characters such as the bidirectional and
//     zero-width ones, private use, unassigned code points, separators
//     and spaces but U+0020, variation selectors, tags, Hangul fillers,
//     ...: see hidden), and a combining mark that has nothing visible to
//     sit on (see below).
//
// A non-spacing or enclosing combining mark (Mn, Me) draws on the
// character before it: written raw at the start of the text, after a
// newline or tab that Lines keeps, or after an escape, it would change
// how that escape or agentrun's own text reads, and a long run of them
// stacks into the lines around it. So Text writes raw only the first
// four (maxMarks) marks that follow a character shown as itself (one that is
// not a mark: a letter, a digit, a spacing mark, a symbol, U+0020); a
// mark at the start, after an escape, or past the fourth in a row is
// escaped, and so is every mark after it up to the next visible
// character.
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

// maxMarks is how many combining marks in a row after a visible
// character Text and Lines write as they are; more are escaped. Writing
// stacks rarely more than three or four on one letter (a Hebrew letter
// with its point, vowel and accent; a Tibetan stack); a longer run only
// draws over the text around it.
const maxMarks = 4

// blanks are graphic characters (So) drawn as blank space that Unicode
// does not list as default-ignorable: the braille blank and the musical
// null notehead.
var blanks = &unicode.RangeTable{R16: []unicode.Range16{{Lo: 0x2800, Hi: 0x2800, Stride: 1}},
	R32: []unicode.Range32{{Lo: 0x1d159, Hi: 0x1d159, Stride: 1}}}

// hidden reports whether r is not visible on its own, so that Text
// escapes it wherever it stands: every rune but U+0020 outside the
// letters, marks, numbers, punctuation and symbols of Go's Unicode
// tables (unicode.Version) — controls (Cc), format characters (Cf),
// private use (Co), surrogates (Cs), unassigned code points (Cn), line
// and paragraph separators (Zl, Zp) and every space but U+0020 (Zs) —
// and the graphic runes drawn as nothing or as blank space: variation
// selectors (U+FE00–FE0F, U+E0100–E01EF, the Mongolian free variation
// selectors U+180B–180F), the other default-ignorable code points
// (U+034F combining grapheme joiner, the Hangul fillers U+115F, U+1160,
// U+3164 and U+FFA0, U+17B4 and U+17B5, tags U+E0000–E0FFF), the
// braille blank U+2800 and U+1D159.
func hidden(r rune) bool {
	if r == ' ' {
		return false
	}
	return !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) ||
		unicode.In(r, unicode.Variation_Selector, unicode.Other_Default_Ignorable_Code_Point, blanks)
}

// escape writes s as Text does; with lines, newline, tab and backslash
// as they are.
func escape(s string, lines bool) string {
	var b strings.Builder
	b.Grow(len(s) + 16)
	// marks is how many combining marks were written raw since the last
	// character shown as itself; -1 when none was (the start, a newline or
	// tab, an escape), and a mark then has nothing to sit on.
	marks := -1
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		next := -1 // marks after this rune
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(hex2(s[i]))
		case lines && r == '\\':
			b.WriteByte('\\')
			next = 0
		case lines && (r == '\n' || r == '\t'):
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
		case hidden(r):
			escapeRune(&b, r)
		case unicode.In(r, unicode.Mn, unicode.Me) && marks >= 0 && marks < maxMarks:
			b.WriteString(s[i : i+size])
			next = marks + 1
		case unicode.In(r, unicode.Mn, unicode.Me):
			escapeRune(&b, r)
		default:
			b.WriteString(s[i : i+size])
			next = 0
		}
		marks = next
		i += size
	}
	return b.String()
}

// escapeRune writes r as \uXXXX or \UXXXXXXXX.
func escapeRune(b *strings.Builder, r rune) {
	if r <= 0xffff {
		b.WriteString(`\u`)
		b.WriteString(pad(strconv.FormatInt(int64(r), 16), 4))
		return
	}
	b.WriteString(`\U`)
	b.WriteString(pad(strconv.FormatInt(int64(r), 16), 8))
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
