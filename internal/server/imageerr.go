package server

import (
	"errors"
	"net/http"

	"github.com/agentrun/agentrun/image"
)

// imageStatus is the status of a run whose image could not be had, by
// the kind of err: 403 refused by policy.registries, 400 not an image
// reference, 422 an image that cannot run (not found, unauthorized, wrong
// platform, too large, unsafe), 502 a registry that failed (unreachable,
// or content that does not match its digest). ok is false for other
// errors.
func imageStatus(err error) (status int, ok bool) {
	var ie *image.Error
	if !errors.As(err, &ie) {
		return 0, false
	}
	switch {
	case errors.Is(err, image.ErrPolicy):
		return http.StatusForbidden, true
	case errors.Is(err, image.ErrBadReference):
		return http.StatusBadRequest, true
	case errors.Is(err, image.ErrUnreachable), errors.Is(err, image.ErrDigestMismatch):
		return http.StatusBadGateway, true
	}
	return http.StatusUnprocessableEntity, true
}
