package config

import (
	"errors"
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
