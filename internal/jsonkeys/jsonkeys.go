// Package jsonkeys finds what makes one JSON text read as two: an object
// that holds a key twice. Readers disagree on such an object (most keep
// the last value, some the first, some refuse it, and Go's encoding/json
// matches a struct's fields whatever their letter case), so a person
// shown {"to": "alice", ..., "to": "mallory"} may approve what a server
// reads otherwise. agentrun refuses such arguments of a tool call and
// such a body of a held request before anyone is asked (spec §5.2,
// §13). The check walks the text's tokens and keeps only the keys of
// the objects open at the time: it never builds the value.
package jsonkeys

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"

	"github.com/agentrun/agentrun/internal/untrusted"
)

// MaxDepth is how deeply Check follows arrays and objects nested in one
// another; a deeper text is refused (ErrTooDeep), since it is not
// checked whole.
const MaxDepth = 128

// maxPath bounds the path a DuplicateError names, escaped.
const maxPath = 512

// ErrTooDeep is Check's error for a text nested deeper than MaxDepth.
var ErrTooDeep = fmt.Errorf("nested deeper than %d arrays and objects: not checked for keys that appear twice", MaxDepth)

// DuplicateError is an object of the text that holds a key twice.
type DuplicateError struct {
	// Path is the second key's JSON Pointer (RFC 6901: "/a/0/to"), the
	// text's own words escaped by untrusted.Text and cut past 512 bytes.
	Path string
	// Fold is set when the two keys differ only in letter case.
	Fold bool
}

func (e *DuplicateError) Error() string {
	if e.Fold {
		return "key " + e.Path + " appears twice in its object, in other letter case (a reader may take them for one key)"
	}
	return "key " + e.Path + " appears twice in its object"
}

// frame is an array or object open at a point of the walk.
type frame struct {
	object bool
	keys   map[string]string // an object's keys so far: folded (fold) -> as read
	key    bool              // an object's next token is a key (or its end)
	name   string            // the key or index of the member or element now read, as a pointer segment
	index  int               // an array's next element's index
}

// Check walks the JSON values of data (one, or several in a row as in
// newline-delimited JSON) and returns a *DuplicateError for the first
// object that holds a key twice: the same after JSON's escapes are read
// (so "to" and "t\u006f" are one key), or the same but for letter case
// (Unicode simple case folding, as Go's encoding/json matches a struct's
// fields). It returns ErrTooDeep past MaxDepth, and the decoder's error
// for data that is not JSON (io.ErrUnexpectedEOF for none at all), once
// the part before the error is checked. data's size is the caller's
// bound: the walk keeps the keys of its open objects alone.
func Check(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // a number is kept as its text: no value is built
	var stack []frame
	for values := 0; ; {
		tok, err := dec.Token()
		switch {
		case err == io.EOF && values > 0 && len(stack) == 0:
			return nil
		case err == io.EOF:
			return io.ErrUnexpectedEOF
		case err != nil:
			return err
		}
		if len(stack) == 0 {
			values++
		}
		if tok == json.Delim('}') || tok == json.Delim(']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			switch {
			case top.object && top.key:
				key, ok := tok.(string)
				if !ok {
					return fmt.Errorf("an object's key is %v, not a string", tok)
				}
				if err := top.add(key, stack); err != nil {
					return err
				}
				top.key = false
				continue
			case top.object:
				top.key = true // a member's value: a key comes next
			default:
				top.name = strconv.Itoa(top.index)
				top.index++
			}
		}
		if tok == json.Delim('{') || tok == json.Delim('[') {
			if len(stack) == MaxDepth {
				return ErrTooDeep
			}
			stack = append(stack, frame{object: tok == json.Delim('{'), key: true})
		}
	}
}

// pointerEscape writes a key as a JSON Pointer's segment: "~" as "~0",
// then "/" as "~1" (not a strings.Replacer made in every agentrun
// process's init, a container's init included).
func pointerEscape(key string) string {
	return strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// add records key among the object f's keys (f the top of stack), and
// fails when f already holds it.
func (f *frame) add(key string, stack []frame) error {
	f.name = pointerEscape(key)
	if f.keys == nil {
		f.keys = map[string]string{}
	}
	k := fold(key)
	if first, seen := f.keys[k]; seen {
		var p strings.Builder
		for _, fr := range stack {
			p.WriteString("/" + fr.name)
		}
		return &DuplicateError{Path: untrusted.Cut(untrusted.Text(p.String()), maxPath), Fold: first != key}
	}
	f.keys[k] = key
	return nil
}

// fold is s with each rune replaced by the least of its simple case
// folding orbit (K, k and the Kelvin sign U+212A are all K), so that two
// keys strings.EqualFold finds equal fold alike.
func fold(s string) string {
	return strings.Map(func(r rune) rune {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, s)
}
