package server

import (
	"net/http"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
)

// A port is named by its path, or with server.preview_domain by a Host
// PORT-ID of that domain alone; anything else is no port's.
func TestPortRoute(t *testing.T) {
	sc := &config.Server{PreviewDomain: "Preview.Test"}
	for _, c := range []struct {
		host, path string
		ok         bool
		want       portTarget
	}{
		{"agentrun", "/v1/sandboxes/sb-1/ports/8000/a/b%2Fc?q=1", true, portTarget{id: "sb-1", port: 8000, path: "/a/b%2Fc"}},
		{"agentrun", "/v1/sandboxes/sb-1/ports/8000", true, portTarget{id: "sb-1", port: 8000, path: "/"}},
		{"agentrun", "/v1/sandboxes/sb-1/ports/80x/", true, portTarget{id: "sb-1", port: 0, path: "/"}},
		{"agentrun", "/v1/sandboxes/sb-1/ports/070/", true, portTarget{id: "sb-1", port: 0, path: "/"}},
		{"agentrun", "/v1/sandboxes/sb-1/ports/65536/", true, portTarget{id: "sb-1", port: 0, path: "/"}},
		{"agentrun", "/v1/sandboxes/sb-1/files/x", false, portTarget{}},
		{"agentrun", "/v1/sandboxes//ports/1/", false, portTarget{}},
		{"3000-sb-1.preview.test:8080", "/v1/runs", true, portTarget{id: "sb-1", port: 3000, path: "/v1/runs", preview: true}},
		{"3000-SB-1.PREVIEW.TEST.", "/x", true, portTarget{id: "sb-1", port: 3000, path: "/x", preview: true}},
		{"a.3000-sb-1.preview.test", "/x", false, portTarget{}},
		{"3000-sb-1.preview.test.evil", "/x", false, portTarget{}},
		{"3000.preview.test", "/x", false, portTarget{}},
		{"preview.test", "/x", false, portTarget{}},
	} {
		r, err := http.NewRequest("GET", "http://x"+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Host = c.host
		got, ok := portRoute(r, sc)
		if ok != c.ok || got != c.want {
			t.Errorf("%s %s: %+v %v; want %+v %v", c.host, c.path, got, ok, c.want, c.ok)
		}
	}
	r, _ := http.NewRequest("GET", "http://3000-sb-1.preview.test/", nil)
	if _, ok := portRoute(r, &config.Server{}); ok {
		t.Error("a preview name with no preview_domain is a port's")
	}
}
