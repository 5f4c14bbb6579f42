package server

import (
	"net/http"

	"github.com/agentrun/agentrun/internal/config"
	"net/http/httptest"
	"testing"
)

// TestHandleOwnAuth: a door under its own credentials (E2B's at /e2b)
// gets its requests without the API's token and with its prefix cut;
// a path that only starts with the same letters is the API's, behind
// the token; the Host check still holds for the door.
func TestHandleOwnAuth(t *testing.T) {
	cfg := reloadBase()
	cfg.E2B.Domain = "e2b.example"
	api := New(cfg, nil, nil)
	var got []string
	api.HandleOwnAuth(E2BPrefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.Path)
		w.WriteHeader(http.StatusTeapot)
	}))
	api.HandleNames(func(c *config.Config) string { return c.E2B.Domain }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}))
	ts := httptest.NewServer(api.Handler())
	defer ts.Close()
	for _, c := range []struct {
		path string
		hdr  map[string]string
		want int
	}{
		{"/e2b/sandboxes", nil, http.StatusTeapot},
		{"/e2b", nil, http.StatusTeapot},
		{"/e2bx/sandboxes", nil, http.StatusUnauthorized},
		{"/e2b/sandboxes", map[string]string{"Host": "elsewhere.example"}, http.StatusMisdirectedRequest},
		// PORT-ID names of the door's domain: its, with no token; an
		// Origin only that name's; other names of the domain foreign.
		{"/any", map[string]string{"Host": "8000-sb-1.E2B.example:443"}, http.StatusAccepted},
		{"/any", map[string]string{"Host": "8000-sb-1.e2b.example", "Origin": "https://8000-sb-1.e2b.example"}, http.StatusAccepted},
		{"/any", map[string]string{"Host": "8000-sb-1.e2b.example", "Origin": "https://8000-sb-2.e2b.example"}, http.StatusForbidden},
		{"/any", map[string]string{"Host": "a.b.e2b.example"}, http.StatusMisdirectedRequest},
	} {
		if st := send(t, "GET", ts.URL+c.path, "", "", c.hdr); st != c.want {
			t.Errorf("GET %s %v: %d, want %d", c.path, c.hdr, st, c.want)
		}
	}
	if len(got) != 2 || got[0] != "/sandboxes" || got[1] != "" {
		t.Errorf("the door got paths %q, want /sandboxes and \"\"", got)
	}
}
