package untrusted

import (
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"GET /repos/a/b?x=1", "GET /repos/a/b?x=1"},
		{"a\nb\r\tc", `a\nb\r\tc`},
		{"\x1b[2J\x1b[H", `\x1b[2J\x1b[H`},
		{"\x00\x7f", `\x00\x7f`},
		{`back\slash`, `back\\slash`},
		{"\u0085\u009b", `\u0085\u009b`},
		{"\u202eevil\u202c", `\u202eevil\u202c`},
		{"a\u200bb\u200d\ufeff", `a\u200bb\u200d\ufeff`},
		{"\u2066x\u2069", `\u2066x\u2069`},
		{"line\u2028sep", `line\u2028sep`},
		{"nb\u00a0sp", `nb\u00a0sp`},
		{"\U000e0041", `\U000e0041`},
		{"bad\xff\xc0\xae", `bad\xff\xc0\xae`},
		{"caf\u00e9 \u65e5\u672c", "caf\u00e9 \u65e5\u672c"},
		{`"quoted"`, `"quoted"`},
	} {
		if got := Text(c.in); got != c.want {
			t.Errorf("Text(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestTextInvariants checks, over every one- and two-byte string and a
// sample of runes, that the output holds only printable runes and reads
// back to the input.
func TestTextInvariants(t *testing.T) {
	check := func(s string) {
		t.Helper()
		out := Text(s)
		if !utf8.ValidString(out) {
			t.Fatalf("Text(%q) = %q: invalid UTF-8", s, out)
		}
		for _, r := range out {
			if !strconv.IsPrint(r) || unicode.Is(unicode.Cf, r) || unicode.IsControl(r) {
				t.Fatalf("Text(%q) = %q: holds %U", s, out, r)
			}
		}
		back, err := strconv.Unquote(`"` + strings.ReplaceAll(out, `"`, `\"`) + `"`)
		if err != nil || back != s {
			t.Fatalf("Text(%q) = %q reads back as %q (%v)", s, out, back, err)
		}
	}
	for a := 0; a < 256; a++ {
		check(string([]byte{byte(a)}))
		for b := 0; b < 256; b += 7 {
			check(string([]byte{byte(a), byte(b)}))
		}
	}
	for r := rune(0); r <= unicode.MaxRune; r += 97 {
		if utf8.ValidRune(r) {
			check("x" + string(r) + "y")
		}
	}
}

func BenchmarkTextPlain(b *testing.B) {
	s := "POST https://api.github.com/repos/org/repo/issues?state=open"
	for b.Loop() {
		Text(s)
	}
}

func TestCut(t *testing.T) {
	if got := Cut("short", 10); got != "short" {
		t.Errorf("Cut(short, 10) = %q", got)
	}
	long := Text(strings.Repeat("a", 7) + "\x1b[2J" + strings.Repeat("é", 4))
	for n := 0; n < len(long); n++ {
		got := Cut(long, n)
		head, mark, ok := strings.Cut(got, "…[cut: ")
		if !ok || !strings.HasPrefix(long, head) || len(head) > n {
			t.Fatalf("Cut(%q, %d) = %q: not a marked prefix of at most %d bytes", long, n, got, n)
		}
		if !utf8.ValidString(head) || strings.HasSuffix(head, `\`) || strings.HasSuffix(head, `\x`) || strings.HasSuffix(head, `\x1`) {
			t.Fatalf("Cut(%q, %d) = %q: cut inside an escape or a rune", long, n, got)
		}
		if want := strconv.Itoa(len(long)) + " bytes, sha256 "; !strings.HasPrefix(mark, want) || len(mark) != len(want)+64+1 {
			t.Fatalf("Cut(%q, %d) = %q: mark %q", long, n, got, mark)
		}
	}
	// Two texts that differ only past the cut are told apart.
	a, b := Cut(strings.Repeat("x", 50)+"a", 10), Cut(strings.Repeat("x", 50)+"b", 10)
	if a == b {
		t.Errorf("Cut of two different texts is the same: %q", a)
	}
}

// TestLines: newline, tab and backslash stay; everything Text escapes
// besides them is escaped alike.
func TestLines(t *testing.T) {
	for in, want := range map[string]string{
		"a\tb\nc\\d":               "a\tb\nc\\d",
		"\r\x1b[2J\x7f":            `\r\x1b[2J\x7f`,
		"\u200b\u202e\ufeff\u2028": `\u200b\u202e\ufeff\u2028`,
		"\u0085\xff é 中":           `\u0085\xff é 中`,
	} {
		if got := Lines(in); got != want {
			t.Errorf("Lines(%q) = %q; want %q", in, got, want)
		}
	}
}
