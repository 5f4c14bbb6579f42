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

// written is a value read from a string, and the string: what a config or
// a task wrote, kept for messages and for writing it back.
type written[T any] struct {
	v    T
	text string
}

// IsSet reports whether a value was given (not absent, null or "").
func (w written[T]) IsSet() bool { return w.text != "" }

// IsZero reports whether the value is unset, so that omitzero leaves it
// out.
func (w written[T]) IsZero() bool { return !w.IsSet() }

// String is the value as it was written ("" when unset).
func (w written[T]) String() string { return w.text }

// MarshalText writes the value as it was read.
func (w written[T]) MarshalText() ([]byte, error) { return []byte(w.text), nil }

// read sets w to b parsed by parse; "" unsets it.
func (w *written[T]) read(b []byte, parse func(string) (T, error)) error {
	if len(b) == 0 {
		*w = written[T]{}
		return nil
	}
	v, err := parse(string(b))
	if err != nil {
		return err
	}
	*w = written[T]{v: v, text: string(b)}
	return nil
}

// mustRead reads s, a built-in value, with read; it panics if s is
// malformed.
func mustRead(read func([]byte) error, s string) {
	if err := read([]byte(s)); err != nil {
		panic(err)
	}
}

// Duration is a Go duration as a config or a task writes it ("5s",
// "1m30s"), read once at decode by ParseDuration's rules (above zero), or
// unset. It is written back, and shown in messages, as it was read.
type Duration struct{ written[time.Duration] }

// MustDuration is the Duration s; it panics if s is not one (for the
// built-in defaults and tests).
func MustDuration(s string) Duration {
	var d Duration
	mustRead(d.UnmarshalText, s)
	return d
}

// Duration is the value; 0 when unset.
func (d Duration) Duration() time.Duration { return d.v }

// UnmarshalText reads a duration by ParseDuration's rules; "" unsets it.
func (d *Duration) UnmarshalText(b []byte) error { return d.read(b, ParseDuration) }

// Size is a byte size as a config or a task writes it ("256m", "1.5g",
// "65536"), read once at decode by ParseSize's rules (zero or more bytes),
// or unset. It is written back, and shown in messages, as it was read.
type Size struct{ written[int64] }

// MustSize is the Size s; it panics if s is not one (for the built-in
// defaults and tests).
func MustSize(s string) Size {
	var z Size
	mustRead(z.UnmarshalText, s)
	return z
}

// Bytes is the size in bytes; 0 when unset.
func (s Size) Bytes() int64 { return s.v }

// UnmarshalText reads a size by ParseSize's rules; "" unsets it.
func (s *Size) UnmarshalText(b []byte) error { return s.read(b, ParseSize) }
