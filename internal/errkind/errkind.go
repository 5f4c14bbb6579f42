package errkind

import (
	"errors"
	"strconv"
)

// Kind is what a failure means to the one who asked.
type Kind uint8

// The kinds. The zero Kind is Unknown.
const (
	// Unknown: nothing says; a failure of the host, not the asker's.
	Unknown Kind = iota
	// Invalid: the request is malformed (a bad task field, image
	// reference, file name or body); fix it and ask again.
	Invalid
	// Policy: well-formed, but the config's policy does not allow it.
	Policy
	// NotFound: what the request names (a session) does not exist.
	NotFound
	// Timeout: the request was not sent within its deadline.
	Timeout
	// Busy: what the request names is in use (a session's run or file
	// access); ask again when that ends.
	Busy
	// TooLarge: the request, or a file of it, is over its byte bound.
	TooLarge
	// Unusable: well-formed and allowed, but what it names cannot be
	// used: an image not found, not authorized, for another platform,
	// too large or unsafe to unpack.
	Unusable
	// Quota: over a quota of the asker's (a session's runs); ask again
	// later.
	Quota
	// Upstream: a service the host depends on failed (a registry
	// unreachable, or content that does not match its digest).
	Upstream
	// Unavailable: the host has no room for it now (no run slot, queue
	// full); ask again later.
	Unavailable
	// Full: a store is at its bound (sessions.max).
	Full
)

var names = [...]string{
	Unknown:     "unknown",
	Invalid:     "invalid",
	Policy:      "policy",
	NotFound:    "not found",
	Timeout:     "timeout",
	Busy:        "busy",
	TooLarge:    "too large",
	Unusable:    "unusable",
	Quota:       "quota",
	Upstream:    "upstream",
	Unavailable: "unavailable",
	Full:        "full",
}

// All is every kind, Unknown first: the doors' mapping tests walk it.
func All() []Kind {
	all := make([]Kind, len(names))
	for i := range all {
		all[i] = Kind(i)
	}
	return all
}

func (k Kind) String() string {
	if int(k) < len(names) {
		return names[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// ErrPolicy is wrapped by every refusal because the config's policy does
// not allow what was asked: a task's limit or network above it, an image
// registry not in policy.registries.
var ErrPolicy = New(Policy, "refused by policy")

// New is a sentinel error of kind k with text as its message, to be
// wrapped with context (fmt.Errorf("...: %w", err)).
func New(k Kind, text string) error { return &sentinel{kind: k, text: text} }

// Mark is err marked with kind k, its message unchanged: for an error
// made with its own words (fmt.Errorf) where no sentinel fits.
func Mark(k Kind, err error) error { return &marked{kind: k, err: err} }

type marked struct {
	kind Kind
	err  error
}

func (e *marked) Error() string { return e.err.Error() }
func (e *marked) Unwrap() error { return e.err }

// Kind is the mark's kind.
func (e *marked) Kind() Kind { return e.kind }

type sentinel struct {
	kind Kind
	text string
}

func (e *sentinel) Error() string { return e.text }

// Kind is the sentinel's kind.
func (e *sentinel) Kind() Kind { return e.kind }

// kinded is an error that says its kind: New's sentinels, Mark's errors, and error types
// whose kind depends on their cause (a task's or an image's error).
type kinded interface {
	error
	Kind() Kind
}

// Of is the kind of err: that of the first error along its chain (err,
// then what it wraps, as errors.As walks) that has a Kind method, or
// Unknown when none has (nil too). The outermost one decides, so an
// error type may say its kind from its cause (see Or).
func Of(err error) Kind {
	var k kinded
	if errors.As(err, &k) {
		return k.Kind()
	}
	return Unknown
}

// Or is the kind of err, or def when err has none: the Kind method of an
// error type whose cause may say its kind (an image error is Unusable
// unless its cause is a policy refusal, a bad reference, an upstream's
// failure).
func Or(err error, def Kind) Kind {
	if k := Of(err); k != Unknown {
		return k
	}
	return def
}
