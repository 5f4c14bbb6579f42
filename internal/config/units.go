package config

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// sizeUnits maps a lowercased unit suffix to its multiplier. All units are
// binary: "k", "kb", "ki" and "kib" all mean 1024.
var sizeUnits = func() map[string]int64 {
	m := map[string]int64{"": 1, "b": 1}
	for i, u := range []string{"k", "m", "g", "t"} {
		mult := int64(1) << (10 * (i + 1))
		for _, s := range []string{"", "b", "i", "ib"} {
			m[u+s] = mult
		}
	}
	return m
}()

// ParseSize parses a byte size such as "65536", "256m", "1.5g", "64MiB" or
// "2GB". Units are binary (k=1024) and case-insensitive. Negative values,
// fractional byte counts, overflow and anything else malformed are errors.
// Zero is accepted; callers decide whether it is meaningful.
func ParseSize(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("empty size")
	}
	if len(s) > 64 {
		return 0, fmt.Errorf("invalid size %.20q...: too long", s)
	}
	if s[0] == '-' {
		return 0, fmt.Errorf("invalid size %q: negative", s)
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.ToLower(s[i:])
	mult, ok := sizeUnits[unit]
	if !ok || !validDecimal(num) {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional unit k, m, g or t", s)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	n := r.Num()
	if !n.IsInt64() {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return n.Int64(), nil
}

// validDecimal reports whether s is digits with at most one inner '.'.
func validDecimal(s string) bool {
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || (hasDot && frac == "") || strings.Contains(frac, ".") {
		return false
	}
	return true
}

// ParseDuration parses a Go duration such as "5s" or "1m30s"; it must be > 0.
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want e.g. \"5s\" or \"2m\"", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("invalid duration %q: must be greater than zero", s)
	}
	return d, nil
}
