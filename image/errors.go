package image

import (
	"errors"
	"fmt"

	"github.com/agentrun/agentrun/image/unpack"
	"github.com/agentrun/agentrun/internal/errkind"
)

// Error kinds. They are wrapped with context; test them with errors.Is.
// An *Error's errkind.Kind is that of its cause: errkind.Policy
// (errkind.ErrPolicy), errkind.Invalid (ErrBadReference), errkind.Upstream
// (ErrUnreachable, ErrDigestMismatch), else errkind.Unusable: an image
// that cannot run.
var (
	// ErrNotFound: the registry, layout or archive has no such image or tag.
	ErrNotFound = errkind.New(errkind.Unusable, "image not found")
	// ErrUnauthorized: the registry refused the credentials (or wants some).
	ErrUnauthorized = errkind.New(errkind.Unusable, "registry authentication failed")
	// ErrUnreachable: the registry could not be reached or kept failing.
	ErrUnreachable = errkind.New(errkind.Upstream, "registry unreachable")
	// ErrPlatform: the image has no variant for the wanted platform.
	ErrPlatform = errkind.New(errkind.Unusable, "image platform mismatch")
	// ErrTooLarge: the layers expand past the store's byte or entry limit.
	ErrTooLarge = unpack.ErrTooLarge
	// ErrUnsafeLayer: a layer entry names or leads outside the rootfs.
	ErrUnsafeLayer = unpack.ErrUnsafeLayer
	// ErrDigestMismatch: a blob's content does not match its digest.
	ErrDigestMismatch = errkind.New(errkind.Upstream, "digest mismatch")
	// ErrBadReference: the reference cannot be parsed.
	ErrBadReference = errkind.New(errkind.Invalid, "bad image reference")
)

// kinds are the error kinds Summary names, most specific first.
var kinds = []error{errkind.ErrPolicy, ErrBadReference, ErrNotFound, ErrUnauthorized, ErrDigestMismatch,
	ErrPlatform, ErrTooLarge, ErrUnsafeLayer, ErrUnreachable}

// Error is what Get and Pull return on failure. Error() tells the whole
// story, for the operator: for a registry reference it may hold what the
// registry sent and the addresses it led to. Summary is the part that the
// author of the reference may see.
type Error struct {
	Ref    string // the reference as given
	Remote bool   // a registry reference
	Err    error  // wraps one of the Err* kinds when one applies
}

func (e *Error) Error() string { return fmt.Sprintf("image %q: %v", e.Ref, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Field is the task's field the error is about, "image", which serve's
// error answer names (its doors build without this package).
func (e *Error) Field() string { return "image" }

// Kind is the kind of Err, or errkind.Unusable when Err has none (an
// image that cannot run: unpacking refused it, or it is of a form not
// handled).
func (e *Error) Kind() errkind.Kind { return errkind.Or(e.Err, errkind.Unusable) }

// Summary is the error as the reference's author may see it. For a
// registry reference it is the reference and the kind of failure only:
// never the registry's own words (an error page), the addresses a
// redirect or a name led to, or how a connection failed, so that an image
// field cannot be used to read or probe services the host reaches. For a
// local reference (oci:, docker-archive:, dir:) it is the whole error:
// its paths are the ones the reference names.
func (e *Error) Summary() string {
	if !e.Remote {
		return e.Error()
	}
	var pe *PolicyError
	if errors.As(e.Err, &pe) {
		return fmt.Sprintf("image %q: %v", e.Ref, pe)
	}
	for _, k := range kinds {
		if errors.Is(e.Err, k) {
			return fmt.Sprintf("image %q: %v", e.Ref, k)
		}
	}
	return fmt.Sprintf("image %q: pulling failed (the host's log has the details)", e.Ref)
}

// PolicyError is a pull the registry policy refused: the reference's
// registry is not listed, or a connection for it (a redirect's, or a name
// that resolved so) was to an address the policy does not allow. It
// matches errkind.ErrPolicy.
type PolicyError struct {
	Registry string // the reference's registry
	// AtConnect: the registry is listed, but a connection for it was to a
	// refused address (the error wrapping this one says which).
	AtConnect bool
}

func (e *PolicyError) Error() string {
	if !e.AtConnect {
		return fmt.Sprintf("%v: registry %s is not in the config's policy.registries", errkind.ErrPolicy, e.Registry)
	}
	// The address stays out of this text: Summary shows it to the task.
	return fmt.Sprintf("%v: a connection for registry %s was to a loopback, private or other non-global address not in policy.registries", errkind.ErrPolicy, e.Registry)
}

func (e *PolicyError) Is(target error) bool { return target == errkind.ErrPolicy }

// Kind is errkind.Policy.
func (e *PolicyError) Kind() errkind.Kind { return errkind.Policy }
