package server

import (
	"fmt"
	"net/http"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
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

// statusKind is the kind whose status is status (errkind.Unknown for a
// status no kind has): a refusal that crossed HTTP (Client) is told apart
// as the one that did not.
func statusKind(status int) errkind.Kind {
	for _, k := range errkind.All() {
		if httpStatus(k) == status {
			return k
		}
	}
	return errkind.Unknown
}

// refusal is the refusal of err by its kind, or by def when it has none.
func refusal(err error, def errkind.Kind, field string) *runapi.Refusal {
	return &runapi.Refusal{Why: errkind.Or(err, def), Field: field, Msg: err.Error()}
}

// tooLarge is the refusal of a task of n bytes, over task.MaxTaskBytes.
func tooLarge(n int64) *runapi.Refusal {
	return refusal(fmt.Errorf("task is %d bytes, more than the maximum %d", n, task.MaxTaskBytes), errkind.TooLarge, "")
}
