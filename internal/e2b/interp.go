package e2b

import (
	"net/http"

	"github.com/agentrun/agentrun/internal/e2b/interp"
)

// interpKey keys a sandbox's code interpreter among what the door keeps
// of it (Call.Keep).
type interpKey struct{}

// routeInterpreter fills mux, the code interpreter's (port 49999):
// /execute and /contexts, answered by the sandbox's interp.Interpreter,
// made at its first call and closed (its contexts' interpreters killed)
// as the sandbox ends.
func (h *Handler) routeInterpreter(mux *http.ServeMux) {
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c := CallOf(r.Context())
		in, _ := c.Keep(interpKey{}, func() any { return interp.New(c.Sandbox) }).(*interp.Interpreter)
		if in == nil {
			writeJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "sandboxId": c.ID,
				"message": "The sandbox was not found: it ended, or never was"})
			return
		}
		in.ServeHTTP(w, r)
	})
}
