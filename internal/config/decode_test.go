package config

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"
)

type inner struct {
	N *int64   `json:"n"`
	F float64  `json:"f"`
	S []string `json:"s"`
}

type doc struct {
	Name string           `json:"name"`
	On   bool             `json:"on"`
	In   inner            `json:"in"`
	M    map[string]inner `json:"m"`
	I32  int32            `json:"i32"`
}

func TestDecodeStrictErrors(t *testing.T) {
	cases := []struct {
		in, path, reason string
	}{
		{`{"nmae":"x"}`, "nmae", ReasonUnknownField},
		{`{"Name":"x"}`, "Name", ReasonUnknownField},
		{`{"in":{"x":1}}`, "in.x", ReasonUnknownField},
		{`{"m":{"a":{"zz":1}}}`, `m["a"].zz`, ReasonUnknownField},
		{`{"name":"a","name":"b"}`, "name", "duplicate key"},
		{`{"m":{"a":{},"a":{}}}`, `m["a"]`, "duplicate key"},
		{`{"name":1}`, "name", "expected a string, got a number"},
		{`{"on":"yes"}`, "on", "expected true or false, got a string"},
		{`{"in":{"n":1.5}}`, "in.n", "1.5 is not an integer in range"},
		{`{"in":{"n":"1"}}`, "in.n", "expected an integer, got a string"},
		{`{"i32":4294967296}`, "i32", "4294967296 is not an integer in range"},
		{`{"in":{"f":1e999}}`, "in.f", "1e999 is out of range"},
		{`{"in":{"s":["a",2]}}`, "in.s[1]", "expected a string, got a number"},
		{`{"in":{"s":"a"}}`, "in.s", "expected an array, got a string"},
		{`{"m":[]}`, "m", "expected an object, got an array"},
		{`{} {}`, "", "unexpected data after the JSON object"},
		{`{}x`, "", "unexpected data after the JSON object"},
		{`null`, "", "expected a JSON object, got null"},
		{`[]`, "", "expected an object, got an array"},
	}
	for _, tc := range cases {
		var d doc
		err := DecodeStrict([]byte(tc.in), &d)
		var de *DecodeError
		if !errors.As(err, &de) || de.Path != tc.path || de.Reason != tc.reason {
			t.Errorf("DecodeStrict(%s) = %v; want path %q reason %q", tc.in, err, tc.path, tc.reason)
		}
	}
	for _, in := range []string{``, `{`, `{"name":}`, `{"in":{"s":[}}`, `{"name":"x",}`} {
		var d doc
		var de *DecodeError
		if err := DecodeStrict([]byte(in), &d); !errors.As(err, &de) {
			t.Errorf("DecodeStrict(%q) = %v; want a *DecodeError", in, err)
		}
	}
}

func TestDecodeStrictMerges(t *testing.T) {
	n := int64(7)
	d := doc{Name: "keep", In: inner{N: &n, F: 2}, M: map[string]inner{"a": {F: 1}}}
	if err := DecodeStrict([]byte(`{"in":{"f":3},"m":{"b":{"f":4}},"on":true}`), &d); err != nil {
		t.Fatal(err)
	}
	if d.Name != "keep" || *d.In.N != 7 || d.In.F != 3 || !d.On || d.M["a"].F != 1 || d.M["b"].F != 4 {
		t.Errorf("merge wrong: %+v", d)
	}
	if err := (&DecodeError{Path: "polcy", Reason: ReasonUnknownField}).Error(); err != `unknown field "polcy"` {
		t.Errorf("Error() = %s", err)
	}
}

type withEmbedded struct {
	inner
	Name string `json:"name"`
}

// TestDecodeStrictFillsAsUnmarshal: what DecodeStrict fills (member by
// member into the outermost struct's fields) is what json.Unmarshal of
// the whole document fills, over the same defaults: merges, nulls that
// clear a pointer, map or slice, a member of an embedded struct, and the
// configs the repository ships.
func TestDecodeStrictFillsAsUnmarshal(t *testing.T) {
	n := int64(7)
	defaults := func() doc {
		return doc{Name: "keep", In: inner{N: &n, F: 2, S: []string{"x"}}, M: map[string]inner{"a": {F: 1}}}
	}
	for _, data := range []string{
		`{}`,
		`{"in":{"f":3,"s":["y","z"]},"m":{"b":{"f":4}},"on":true,"i32":-5}`,
		`{"in":{"n":null,"s":null},"m":null,"name":null}`,
		`{"in":null,"m":{"a":null}}`,
		`{"name":"n\u00e9w","in":{"n":9}}`,
	} {
		got, want := defaults(), defaults()
		if err := DecodeStrict([]byte(data), &got); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if err := json.Unmarshal([]byte(data), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: DecodeStrict filled %+v, json.Unmarshal %+v", data, got, want)
		}
	}
	var e, ew withEmbedded
	const data = `{"f":1.5,"name":"e","s":["a"]}`
	if err := DecodeStrict([]byte(data), &e); err != nil {
		t.Fatal(err)
	}
	if json.Unmarshal([]byte(data), &ew) != nil || !reflect.DeepEqual(e, ew) {
		t.Errorf("embedded: DecodeStrict filled %+v, json.Unmarshal %+v", e, ew)
	}
	for _, f := range []string{"../../packaging/config.json", "../../examples/serve-config.json", "../../examples/demo-config.json"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, want := Default(), Default()
		if err := DecodeStrict(data, got); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := json.Unmarshal(data, want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: DecodeStrict filled %+v, json.Unmarshal %+v", f, got, want)
		}
	}
}
