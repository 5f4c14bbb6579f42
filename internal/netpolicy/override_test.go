package netpolicy

import (
	"fmt"
	"testing"
)

func TestMethodOverrides(t *testing.T) {
	for _, tc := range []struct {
		q    string
		want []string
	}{
		{"", nil},
		{"a=1&b=2", nil},
		{"method=DELETE&x_method=PUT&_methods=PUT", nil},
		{"_method=", nil},
		{"_method=DELETE", []string{"DELETE"}},
		{"a=1&_method=delete", []string{"DELETE"}},
		{"_METHOD=Put", []string{"PUT"}},
		{"_Method=patch&_method=DELETE", []string{"PATCH", "DELETE"}},
		{"%5Fmethod=DELETE", []string{"DELETE"}},
		{"%5fMETHOD=DELETE", []string{"DELETE"}},
		{"%255Fmethod=DELETE", []string{"DELETE"}},
		{"_%6Dethod=DELETE", []string{"DELETE"}},
		{"_method%5B%5D=DELETE", []string{"DELETE"}},
		{"_method[]=DELETE", []string{"DELETE"}},
		{"a=1;_method=DELETE", []string{"DELETE"}},
		{"_method=%44ELETE", []string{"DELETE"}},
		{"_method=+delete+", []string{"DELETE"}},
		{"_method", nil},
		{"_method=TRACE", []string{"TRACE"}},
	} {
		if got := MethodOverrides(tc.q); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("MethodOverrides(%q) = %q; want %q", tc.q, got, tc.want)
		}
	}
}
