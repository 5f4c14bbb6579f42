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
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
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
