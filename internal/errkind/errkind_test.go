package errkind

import (
	"errors"
	"fmt"
	"testing"
)

// causeKind is an error type that says its kind from its cause, as the
// task's and the image's errors do.
type causeKind struct{ err error }

func (e *causeKind) Error() string { return "wrapped: " + e.err.Error() }
func (e *causeKind) Unwrap() error { return e.err }
func (e *causeKind) Kind() Kind    { return Or(e.err, Unusable) }

func TestOf(t *testing.T) {
	busy := New(Busy, "session busy")
	for _, tc := range []struct {
		name string
		err  error
		want Kind
	}{
		{"nil", nil, Unknown},
		{"unmarked", errors.New("disk on fire"), Unknown},
		{"sentinel", busy, Busy},
		{"wrapped sentinel", fmt.Errorf("run 1: %w", fmt.Errorf("%w: ss-1", busy)), Busy},
		{"policy", fmt.Errorf("registry x: %w", ErrPolicy), Policy},
		{"marked", Mark(TooLarge, errors.New("task is 5 bytes")), TooLarge},
		{"joined, first marked wins", errors.Join(errors.New("x"), New(Quota, "q"), New(Full, "f")), Quota},
		{"outer mark decides", Mark(Invalid, fmt.Errorf("reading: %w", busy)), Invalid},
		{"type, from its cause", &causeKind{fmt.Errorf("pull: %w", ErrPolicy)}, Policy},
		{"type, its default", &causeKind{errors.New("no such manifest")}, Unusable},
	} {
		if got := Of(tc.err); got != tc.want {
			t.Errorf("%s: Of(%v) = %v; want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestMessagesUnchanged(t *testing.T) {
	inner := errors.New("task is 5 bytes, more than the maximum 4")
	m := Mark(TooLarge, inner)
	if m.Error() != inner.Error() || !errors.Is(m, inner) {
		t.Errorf("Mark: %q, Is %v; want the error's own message, wrapping it", m, errors.Is(m, inner))
	}
	if err := fmt.Errorf("%w: ss-1", New(Busy, "session busy")); err.Error() != "session busy: ss-1" {
		t.Errorf("New wrapped: %q", err)
	}
	if !errors.Is(fmt.Errorf("x: %w", ErrPolicy), ErrPolicy) {
		t.Error("errors.Is does not find ErrPolicy through a wrap")
	}
}

func TestOr(t *testing.T) {
	if got := Or(errors.New("x"), Invalid); got != Invalid {
		t.Errorf("Or(unmarked, Invalid) = %v", got)
	}
	if got := Or(ErrPolicy, Invalid); got != Policy {
		t.Errorf("Or(ErrPolicy, Invalid) = %v", got)
	}
}

func TestAllNamed(t *testing.T) {
	seen := map[string]bool{}
	for i, k := range All() {
		if int(k) != i {
			t.Errorf("All()[%d] = %d", i, k)
		}
		if s := k.String(); s == "" || seen[s] {
			t.Errorf("kind %d: name %q empty or repeated", k, s)
		} else {
			seen[s] = true
		}
	}
	if All()[0] != Unknown || len(All()) != int(Full)+1 {
		t.Errorf("All() = %v; want Unknown through Full", All())
	}
	if s := Kind(200).String(); s != "Kind(200)" {
		t.Errorf("Kind(200).String() = %q", s)
	}
}
