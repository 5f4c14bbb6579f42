package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestHandleOwnAuth: a door under its own credentials (E2B's at /e2b)
// gets its requests without the API's token and with its prefix cut;
// a path that only starts with the same letters is the API's, behind
// the token; the Host check still holds for the door.
func TestHandleOwnAuth(t *testing.T) {
	cfg := reloadBase()
	api := New(cfg, nil, nil)
	var got []string
	api.HandleOwnAuth(E2BPrefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.Path)
		w.WriteHeader(http.StatusTeapot)
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
	} {
		if st := send(t, "GET", ts.URL+c.path, "", "", c.hdr); st != c.want {
			t.Errorf("GET %s %v: %d, want %d", c.path, c.hdr, st, c.want)
		}
	}
	if len(got) != 2 || got[0] != "/sandboxes" || got[1] != "" {
		t.Errorf("the door got paths %q, want /sandboxes and \"\"", got)
	}
}
