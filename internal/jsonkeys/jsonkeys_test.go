package jsonkeys

import (
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		in   string
		path string // the DuplicateError's; "" for none
		fold bool
	}{
		{in: `{}`},
		{in: `[]`},
		{in: `1`},
		{in: `"to"`},
		{in: `{"to":"alice","cc":"bob"}`},
		{in: `{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`},
		{in: `[{"to":1},{"to":2}]`},
		{in: `{"a":{"x":1},"b":{"x":1}}`},
		{in: "{\"to\":1}\n{\"to\":1}\n"},
		{in: ` {"to":1} {"to":1,"to":2}`, path: "/to"}, // each value of a sequence
		{in: `1 2 [3] {"a":[{}]} "x"`},
		{in: `{"to":"alice","to":"mallory"}`, path: "/to"},
		{in: `{"to":1,"t\u006f":2}`, path: "/to"},
		{in: `{"a":{"b":1,"c":2,"b":3}}`, path: "/a/b"},
		{in: `[0,{"x":1,"x":1}]`, path: "/1/x"},
		{in: `{"l":[1,2,{"q":[],"q":{}}]}`, path: "/l/2/q"},
		{in: `{"a":{"x":1},"a":2}`, path: "/a"},
		{in: `{"a":[{"x":1}],"b":[],"a":2}`, path: "/a"},
		{in: `{"a/b":{"c~d":1,"c~d":1}}`, path: "/a~1b/c~0d"},
		{in: `{"to":1,"TO":2}`, path: "/TO", fold: true},
		{in: `{"k":1,"\u212a":2}`, path: "/\u212a", fold: true},
		{in: `{"s":1,"\u017f":2}`, path: "/\u017f", fold: true},
		{in: "{\"x\\ny\u202e\":1,\"x\\nY\u202e\":2}", path: `/x\nY\u202e`, fold: true},
		{in: "{\"\xff\":1,\"\xfe\":2}", path: "/\ufffd"},            // invalid UTF-8 reads as U+FFFD alike
		{in: `{"to":1,"to"`, path: "/to"},                           // found before the text breaks off
		{in: `{"to":"a\ufe0f","to\ufe0f":"b"}`},                     // another key, shown apart by untrusted.Text
		{in: `{"n":1e400,"m":-0.0000001,"o":12345678901234567890}`}, // numbers stay text
	} {
		err := Check([]byte(c.in))
		var dup *DuplicateError
		switch {
		case c.path == "" && err != nil:
			t.Errorf("Check(%q) = %v; want nil", c.in, err)
		case c.path != "" && (!errors.As(err, &dup) || dup.Path != c.path || dup.Fold != c.fold):
			t.Errorf("Check(%q) = %#v (%v); want a duplicate at %q, fold %v", c.in, err, err, c.path, c.fold)
		}
	}
}

func TestCheckNotJSON(t *testing.T) {
	for _, in := range []string{``, ` `, `{`, `{"a":1,`, `{"a" 1}`, `{1:2}`, `[1,]`, `nul`, `{"a":NaN}`, `{"a":1} garbage`, "\ufeff{}"} {
		err := Check([]byte(in))
		var dup *DuplicateError
		if err == nil || errors.As(err, &dup) || errors.Is(err, ErrTooDeep) {
			t.Errorf("Check(%q) = %v; want the decoder's error", in, err)
		}
	}
	if err := Check(nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("Check(nil) = %v; want %v", err, io.ErrUnexpectedEOF)
	}
}

func TestCheckDepth(t *testing.T) {
	deep := func(n int) []byte {
		return []byte(strings.Repeat(`{"a":[`, n/2) + strings.Repeat(`]}`, n/2))
	}
	if err := Check(deep(MaxDepth)); err != nil {
		t.Errorf("Check of %d levels = %v; want nil", MaxDepth, err)
	}
	if err := Check(deep(MaxDepth + 2)); !errors.Is(err, ErrTooDeep) {
		t.Errorf("Check of %d levels = %v; want ErrTooDeep", MaxDepth+2, err)
	}
	if err := Check([]byte(strings.Repeat("[", 100000))); !errors.Is(err, ErrTooDeep) {
		t.Errorf("Check of 100000 [ = %v; want ErrTooDeep", err)
	}
}

// TestCheckPathCut: a path too long to show whole is cut, with a mark.
func TestCheckPathCut(t *testing.T) {
	long := strings.Repeat("k", 4000)
	err := Check([]byte(`{"` + long + `":{"a":1,"a":2}}`))
	var dup *DuplicateError
	if !errors.As(err, &dup) || len(dup.Path) > maxPath+200 || !strings.Contains(dup.Path, "…[cut: ") {
		t.Errorf("Check of a %d-byte key's duplicate = %v; want its path cut", len(long), err)
	}
}

// TestCheckRandom: over random JSON texts whose objects draw their keys
// from a small set (some alike but for case or escapes), Check finds a
// duplicate exactly when the text holds one.
func TestCheckRandom(t *testing.T) {
	keys := []struct{ text, folded string }{{`"a"`, "a"}, {`"A"`, "a"}, {`"\u0061"`, "a"}, {`"b"`, "b"},
		{`"to"`, "to"}, {`"tO"`, "to"}, {`"c/d"`, "c/d"}, {`"\u00e9"`, "\u00e9"}, {`"\u00c9"`, "\u00e9"}}
	rng := rand.New(rand.NewPCG(3, 4))
	var gen func(b *strings.Builder, depth int) bool
	gen = func(b *strings.Builder, depth int) (dup bool) {
		switch k := rng.IntN(4); {
		case depth > 5 || k == 0:
			b.WriteString(strconv.Itoa(rng.IntN(100)))
		case k == 1:
			b.WriteString("[")
			for i := range rng.IntN(4) {
				if i > 0 {
					b.WriteString(",")
				}
				dup = gen(b, depth+1) || dup
			}
			b.WriteString("]")
		default:
			b.WriteString("{")
			seen := map[string]bool{}
			for i := range rng.IntN(4) {
				if i > 0 {
					b.WriteString(",")
				}
				key := keys[rng.IntN(len(keys))]
				dup = dup || seen[key.folded]
				seen[key.folded] = true
				b.WriteString(key.text + ":")
				dup = gen(b, depth+1) || dup
			}
			b.WriteString("}")
		}
		return dup
	}
	for range 5000 {
		var b strings.Builder
		dup := gen(&b, 0)
		if !json.Valid([]byte(b.String())) {
			t.Fatalf("made %s: not JSON", b.String())
		}
		err := Check([]byte(b.String()))
		var d *DuplicateError
		if got := errors.As(err, &d); got != dup || (!got && err != nil) {
			t.Fatalf("Check(%s) = %v; want a duplicate: %v", b.String(), err, dup)
		}
	}
}
