package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// A run that failed on its image answers with a status of the error's
// kind and the error's summary, not 500 with a flattened string.
func TestAPIImageErrorStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{&image.PolicyError{Registry: "127.0.0.1:1"}, http.StatusForbidden},
		{image.ErrNotFound, http.StatusUnprocessableEntity},
		{image.ErrUnauthorized, http.StatusUnprocessableEntity},
		{image.ErrBadReference, http.StatusBadRequest},
		{image.ErrUnreachable, http.StatusBadGateway},
		{image.ErrDigestMismatch, http.StatusBadGateway},
	} {
		ierr := &image.Error{Ref: "reg:5000/x:y", Remote: true, Err: fmt.Errorf("fetching manifest: %w: <html>secret</html>", tc.err)}
		ts := testServer(t, nil, func(context.Context, *task.Plan, runapi.Hooks) *result.Result {
			return &result.Result{ID: "ar-1", Error: ierr.Summary(), Err: ierr}
		})
		resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(`{"code": "x"}`))
		if err != nil {
			t.Fatal(err)
		}
		var body APIError
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want || body.Field != "image" || !strings.Contains(body.Error, "reg:5000/x:y") ||
			!strings.Contains(body.Error, "ar-1") || strings.Contains(body.Error, "secret") {
			t.Errorf("%v: status %d %+v; want %d with the summary", tc.err, resp.StatusCode, body, tc.want)
		}
		if !errors.Is(ierr, tc.err) {
			t.Errorf("%v is not its kind", ierr)
		}
	}
}

// Every kind has its one status, and the errors the packages make carry
// the kind whose status serve answered with before the kinds existed.
func TestHTTPStatus(t *testing.T) {
	want := map[errkind.Kind]int{
		errkind.Unknown:     http.StatusInternalServerError,
		errkind.Invalid:     http.StatusBadRequest,
		errkind.Policy:      http.StatusForbidden,
		errkind.NotFound:    http.StatusNotFound,
		errkind.Timeout:     http.StatusRequestTimeout,
		errkind.Busy:        http.StatusConflict,
		errkind.TooLarge:    http.StatusRequestEntityTooLarge,
		errkind.Unusable:    http.StatusUnprocessableEntity,
		errkind.Quota:       http.StatusTooManyRequests,
		errkind.Upstream:    http.StatusBadGateway,
		errkind.Unavailable: http.StatusServiceUnavailable,
		errkind.Full:        http.StatusInsufficientStorage,
	}
	for _, k := range errkind.All() {
		w, ok := want[k]
		if !ok {
			t.Errorf("kind %v: no status in this test; add it", k)
			continue
		}
		if got := httpStatus(k); got != w {
			t.Errorf("httpStatus(%v) = %d; want %d", k, got, w)
		}
	}

	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("%w: ss-1", session.ErrBusy), http.StatusConflict},
		{fmt.Errorf("%w: ss-1", session.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("%w: 1000", session.ErrFull), http.StatusInsufficientStorage},
		{fmt.Errorf("%w: more than 16 bytes", session.ErrTooLarge), http.StatusRequestEntityTooLarge},
		{fmt.Errorf("%w: ..", session.ErrBadPath), http.StatusBadRequest},
		{&task.Error{Field: "code", Reason: "missing"}, http.StatusBadRequest},
		{&task.Error{Field: "limits.memory", Reason: "4g exceeds policy maximum 2g", Err: errkind.ErrPolicy}, http.StatusForbidden},
		{&quotaError{quota: "per_minute", msg: "over"}, http.StatusTooManyRequests},
		{fmt.Errorf("%w: 4 runs going on", errQueueFull), http.StatusServiceUnavailable},
		{&image.Error{Ref: "x", Err: fmt.Errorf("unpacking: %w", image.ErrUnsafeLayer)}, http.StatusUnprocessableEntity},
		{&image.Error{Ref: "x", Err: errors.New("manifest of an unsupported media type")}, http.StatusUnprocessableEntity},
		{&image.Error{Ref: "x", Err: fmt.Errorf("registry x: %w", &image.PolicyError{Registry: "x"})}, http.StatusForbidden},
		{errors.New("disk on fire"), http.StatusInternalServerError},
		{nil, http.StatusInternalServerError},
	} {
		if got := statusOf(tc.err); got != tc.want {
			t.Errorf("statusOf(%v) = %d; want %d", tc.err, got, tc.want)
		}
	}
}

// The refusals keep their statuses, fields and defaults: a task error
// that is no *task.Error is still the task's (400); a quota's or the
// queue's whatever its error.
func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ref   *runapi.Refusal
		want  int
		field string
	}{
		{"task", runapi.TaskRefusal(&task.Error{Field: "code", Reason: "missing"}), http.StatusBadRequest, "code"},
		{"policy", runapi.TaskRefusal(&task.Error{Field: "limits.memory", Reason: "over", Err: errkind.ErrPolicy}), http.StatusForbidden, "limits.memory"},
		{"load gave up", runapi.TaskRefusal(fmt.Errorf("gave up waiting to decode the task: %w", context.Canceled)), http.StatusBadRequest, ""},
		{"too large", tooLarge(task.MaxTaskBytes + 1), http.StatusRequestEntityTooLarge, ""},
		{"session", refusal(fmt.Errorf("%w: ss-1", session.ErrBusy), errkind.Unknown, "session"), http.StatusConflict, "session"},
		{"unmarked", refusal(errors.New("x"), errkind.Unknown, ""), http.StatusInternalServerError, ""},
	} {
		if httpStatus(tc.ref.Kind()) != tc.want || tc.ref.Field != tc.field {
			t.Errorf("%s: %+v; want status %d, field %q", tc.name, tc.ref, tc.want, tc.field)
		}
	}
	if ref := tooLarge(7 << 20); ref.Msg != fmt.Sprintf("task is %d bytes, more than the maximum %d", 7<<20, task.MaxTaskBytes) {
		t.Errorf("tooLarge: %q", ref.Msg)
	}
}

// A refusal's kind is the kind of its status, so that one that crossed
// HTTP is told apart as the one that did not.
func TestRefusalKind(t *testing.T) {
	for _, k := range errkind.All() {
		if got := (&runapi.Refusal{Why: statusKind(httpStatus(k))}).Kind(); got != k {
			t.Errorf("a refusal of status %d: kind %v; want %v", httpStatus(k), got, k)
		}
	}
	if got := errkind.Of(fmt.Errorf("asking: %w", &runapi.Refusal{Why: statusKind(418)})); got != errkind.Unknown {
		t.Errorf("a refusal of status 418: kind %v; want unknown", got)
	}
}
