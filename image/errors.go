package image

import (
	"errors"

	"github.com/agentrun/agentrun/image/unpack"
)

// Error kinds. They are wrapped with context; test them with errors.Is.
var (
	// ErrNotFound: the registry, layout or archive has no such image or tag.
	ErrNotFound = errors.New("image not found")
	// ErrUnauthorized: the registry refused the credentials (or wants some).
	ErrUnauthorized = errors.New("registry authentication failed")
	// ErrUnreachable: the registry could not be reached or kept failing.
	ErrUnreachable = errors.New("registry unreachable")
	// ErrPlatform: the image has no variant for the wanted platform.
	ErrPlatform = errors.New("image platform mismatch")
	// ErrTooLarge: the layers expand past the store's byte or entry limit.
	ErrTooLarge = unpack.ErrTooLarge
	// ErrUnsafeLayer: a layer entry names or leads outside the rootfs.
	ErrUnsafeLayer = unpack.ErrUnsafeLayer
	// ErrDigestMismatch: a blob's content does not match its digest.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrBadReference: the reference cannot be parsed.
	ErrBadReference = errors.New("bad image reference")
)
