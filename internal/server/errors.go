package server

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/task"
)

// httpStatus is serve's status for a failure of kind k: the one place
// where errkind's kinds become HTTP statuses (openapi.json lists them by
// endpoint). An unmarked failure is the host's: 500.
func httpStatus(k errkind.Kind) int {
	switch k {
	case errkind.Invalid:
		return http.StatusBadRequest
	case errkind.Policy:
		return http.StatusForbidden
	case errkind.NotFound:
		return http.StatusNotFound
	case errkind.Timeout:
		return http.StatusRequestTimeout
	case errkind.Busy:
		return http.StatusConflict
	case errkind.TooLarge:
		return http.StatusRequestEntityTooLarge
	case errkind.Unusable:
		return http.StatusUnprocessableEntity
	case errkind.Quota:
		return http.StatusTooManyRequests
	case errkind.Upstream:
		return http.StatusBadGateway
	case errkind.Unavailable:
		return http.StatusServiceUnavailable
	case errkind.Full:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// statusOf is the HTTP status of err by its kind.
func statusOf(err error) int { return httpStatus(errkind.Of(err)) }

// Refusal is a task the server would not run, with the HTTP status that
// says why: 400 bad task, 403 above policy, 404 or 409 a kept session
// unknown or busy, 413 too large, 429 over a session quota, 503 busy.
// Field names the task field at fault, if one is.
type Refusal struct {
	Status     int
	Field      string
	Msg        string
	RetryAfter time.Duration // when it may be tried again; 0 if not said
}

func (r *Refusal) Error() string { return r.Msg }

// Kind is the kind whose status the refusal has (errkind.Unknown for a
// status no kind has), so that a refusal that crossed HTTP (Client) is
// told apart as the one that did not.
func (r *Refusal) Kind() errkind.Kind {
	for _, k := range errkind.All() {
		if httpStatus(k) == r.Status {
			return k
		}
	}
	return errkind.Unknown
}

// refusal is the refusal of err by its kind, or by def when it has none.
func refusal(err error, def errkind.Kind, field string) *Refusal {
	return &Refusal{Status: httpStatus(errkind.Or(err, def)), Field: field, Msg: err.Error()}
}

// taskRefusal is the refusal of a task that does not load: 400, or 403
// above policy, naming the field at fault.
func taskRefusal(err error) *Refusal {
	field := ""
	var te *task.Error
	if errors.As(err, &te) {
		field = te.Field
	}
	return refusal(err, errkind.Invalid, field)
}

// tooLarge is the refusal of a task of n bytes, over task.MaxTaskBytes.
func tooLarge(n int64) *Refusal {
	return refusal(fmt.Errorf("task is %d bytes, more than the maximum %d", n, task.MaxTaskBytes), errkind.TooLarge, "")
}
