package netpolicy

import (
	"net/url"
	"strings"
)

// MethodParam is the parameter that Rails (Rack::MethodOverride),
// Laravel, Symfony and Express's method-override read, in a query or a
// form body, as a POST request's real method.
const MethodParam = "_method"

// MethodOverrides returns the methods (upper case, as servers read them)
// that the "_method" parameters of the form- or query-encoded text q ask
// for, in order; nil when it has none. A name counts in any case and
// percent-encoded (once or twice: "%5Fmethod", "%255Fmethod"), also with
// a "[...]" suffix (Rack's "_method[]"); pairs are split at "&" and at
// ";" (which older Rack and many CGI readers split at too). An empty
// value asks for nothing.
func MethodOverrides(q string) []string {
	var ms []string
	for _, pair := range strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, _ := strings.Cut(pair, "=")
		if !overrideName(k) {
			continue
		}
		if dec, err := url.QueryUnescape(v); err == nil {
			v = dec
		}
		if v = strings.ToUpper(strings.TrimSpace(v)); v != "" {
			ms = append(ms, v)
		}
	}
	return ms
}

// overrideName reports whether the raw parameter name k reads as
// MethodParam, as sent or decoded once or twice.
func overrideName(k string) bool {
	for range 3 {
		name, _, _ := strings.Cut(k, "[")
		if strings.EqualFold(strings.TrimSpace(name), MethodParam) {
			return true
		}
		dec, err := url.QueryUnescape(k)
		if err != nil || dec == k {
			return false
		}
		k = dec
	}
	return false
}
