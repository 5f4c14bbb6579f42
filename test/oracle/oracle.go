// Package oracle checks, in tests, that a hand-written name check accepts
// exactly what the regular expression of its rule matches: on given edge
// cases and on random strings over the bytes that matter.
package oracle

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// Random returns n strings of up to maxLen bytes drawn from alphabet, the
// same for the same seed.
func Random(seed uint64, n, maxLen int, alphabet string) []string {
	r := rand.New(rand.NewPCG(seed, seed+1))
	out := make([]string, n)
	for i := range out {
		b := make([]byte, r.IntN(maxLen+1))
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		out[i] = string(b)
	}
	return out
}

// Match fails t for each case where ok and the regular expression expr
// disagree.
func Match(t *testing.T, name string, ok func(string) bool, expr string, cases []string) {
	t.Helper()
	re := regexp.MustCompile(expr)
	for _, s := range cases {
		if got, want := ok(s), re.MatchString(s); got != want {
			t.Errorf("%s %q: %v, want %v (%s)", name, s, got, want, expr)
		}
	}
}
