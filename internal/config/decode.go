package config

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// DecodeError says why a JSON document does not fit its Go type. Path names
// the offending key the way a person would write it ("limits.cpus",
// `files["a.txt"].content`, "command[0]"); it is "" for the document as a whole.
type DecodeError struct {
	Path   string
	Reason string
}

// ReasonUnknownField is the Reason of a DecodeError for a key the type lacks.
const ReasonUnknownField = "unknown field"

func (e *DecodeError) Error() string {
	switch {
	case e.Reason == ReasonUnknownField:
		return fmt.Sprintf("unknown field %q", e.Path)
	case e.Path == "":
		return e.Reason
	}
	return e.Path + ": " + e.Reason
}

// DecodeStrict decodes the single JSON object in data into v, a non-nil
// pointer to a struct. Keys absent from data leave v's values alone (maps are
// merged per key, nested structs per field), so v may hold defaults. Unknown or
// duplicate keys (matched exactly, not case-insensitively), values of the wrong
// type, numbers out of range and data after the object are refused with a
// *DecodeError naming the key.
func DecodeStrict(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("config: DecodeStrict needs a non-nil pointer")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := walker{dec: dec}
	if err := w.value(rv.Type().Elem(), ""); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return &DecodeError{Reason: "unexpected data after the JSON object"}
	}
	// The walk has checked keys and types; this fills v.
	if err := fill(data, rv.Elem(), w.members); err != nil {
		return &DecodeError{Reason: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	return nil
}

// fill has json.Unmarshal fill struct v from data, whose members the walk
// found to be v's own fields (members, in order): member by member, into
// each field, which is what json.Unmarshal of the whole does with them.
// The whole would first make json's field list of v's type, and with it
// an encoder for every type v reaches (encoding/json's typeFields), about
// a millisecond of a one-shot run for the config's types, of which a
// document names a few. A member in an embedded struct (json's rules of
// which field wins) leaves the whole to json.Unmarshal.
func fill(data []byte, v reflect.Value, members []member) error {
	if v.Kind() != reflect.Struct || slices.ContainsFunc(members, func(m member) bool { return len(m.field.Index) != 1 }) {
		return json.Unmarshal(data, v.Addr().Interface())
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	for _, m := range members {
		if err := json.Unmarshal(raw[m.key], v.Field(m.field.Index[0]).Addr().Interface()); err != nil {
			return err
		}
	}
	return nil
}

// walker checks a token stream against a Go type before json.Unmarshal fills
// it, so that every error can name its key path exactly. It keeps the
// members of the outermost object, if a struct, for fill.
type walker struct {
	dec     *json.Decoder
	depth   int
	members []member
}

// member is a key of the outermost object and the field it names.
type member struct {
	key   string
	field reflect.StructField
}

func (w *walker) value(t reflect.Type, path string) error {
	tok, err := w.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return &DecodeError{Path: path, Reason: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if tok == nil {
		if path == "" {
			return &DecodeError{Reason: "expected a JSON object, got null"}
		}
		return nil // null keeps the value (or clears a pointer, slice or map)
	}
	bad := func(want string) error {
		return &DecodeError{Path: path, Reason: fmt.Sprintf("expected %s, got %s", want, kindOf(tok))}
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		// A value read from a string (Duration, Size, netip.Prefix,
		// netip.AddrPort): read
		// it here, so that its error names the key.
		str, ok := tok.(string)
		if !ok {
			return bad("a string")
		}
		if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(str)); err != nil {
			reason := err.Error()
			switch t {
			case reflect.TypeFor[netip.Prefix]():
				reason = fmt.Sprintf("%q is not a CIDR range (e.g. 10.0.0.0/8)", str)
			case reflect.TypeFor[netip.Addr]():
				reason = fmt.Sprintf("%q is not an IP address", str)
			case reflect.TypeFor[netip.AddrPort]():
				reason = fmt.Sprintf("%q is not an address and port (e.g. 127.0.0.1:4222 or [::1]:4222)", str)
			}
			return &DecodeError{Path: path, Reason: reason}
		}
		if t == reflect.TypeFor[netip.Addr]() && str == "" {
			// netip.Addr reads "" as no address, which a host entry
			// never is.
			return &DecodeError{Path: path, Reason: `"" is not an IP address`}
		}
		return nil
	}
	if t == reflect.TypeFor[PoolEntry]() {
		// A count, or the object.
		if n, ok := tok.(json.Number); ok {
			if _, err := strconv.ParseInt(string(n), 10, 0); err != nil {
				return &DecodeError{Path: path, Reason: fmt.Sprintf("%s is not an integer in range", n)}
			}
			return nil
		}
		if tok != json.Delim('{') {
			return bad("a count or an object")
		}
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		if tok != json.Delim('{') {
			return bad("an object")
		}
		return w.object(t, path)
	case reflect.Slice, reflect.Array:
		if tok != json.Delim('[') {
			return bad("an array")
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.value(t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return w.closing(path)
	case reflect.String:
		if _, ok := tok.(string); !ok {
			return bad("a string")
		}
	case reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return bad("true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := tok.(json.Number)
		if !ok {
			return bad("an integer")
		}
		if _, err := strconv.ParseInt(string(n), 10, t.Bits()); err != nil {
			return &DecodeError{Path: path, Reason: fmt.Sprintf("%s is not an integer in range", n)}
		}
	case reflect.Float32, reflect.Float64:
		n, ok := tok.(json.Number)
		if !ok {
			return bad("a number")
		}
		if _, err := strconv.ParseFloat(string(n), t.Bits()); err != nil {
			return &DecodeError{Path: path, Reason: fmt.Sprintf("%s is out of range", n)}
		}
	default:
		return &DecodeError{Path: path, Reason: "unsupported type " + t.String()}
	}
	return nil
}

// object walks the members of an object; the '{' has been read.
func (w *walker) object(t reflect.Type, path string) error {
	w.depth++
	defer func() { w.depth-- }()
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return &DecodeError{Path: path, Reason: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
		}
		key := tok.(string) // the decoder guarantees object keys are strings
		var child reflect.Type
		var childPath string
		if t.Kind() == reflect.Map {
			child, childPath = t.Elem(), path+"["+strconv.Quote(key)+"]"
		} else {
			childPath = key
			if path != "" {
				childPath = path + "." + key
			}
			f, ok := fieldByJSONName(t, key)
			if !ok {
				return &DecodeError{Path: childPath, Reason: ReasonUnknownField}
			}
			child = f.Type
			if w.depth == 1 {
				w.members = append(w.members, member{key, f})
			}
		}
		if seen[key] {
			return &DecodeError{Path: childPath, Reason: "duplicate key"}
		}
		seen[key] = true
		if err := w.value(child, childPath); err != nil {
			return err
		}
	}
	return w.closing(path)
}

// closing reads the '}' or ']' that ends the object or array at path.
func (w *walker) closing(path string) error {
	if _, err := w.dec.Token(); err != nil {
		return &DecodeError{Path: path, Reason: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	return nil
}

// fieldByJSONName finds the exported field whose json tag name is exactly
// name, in t or a struct t embeds without a name (as Policy embeds Limits);
// its Index is the path from t.
func fieldByJSONName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			if ef, ok := fieldByJSONName(f.Type, name); ok {
				ef.Index = append([]int{i}, ef.Index...)
				return ef, true
			}
			continue
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

func kindOf(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "null"
}
