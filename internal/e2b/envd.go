package e2b

import (
	"net/http"
)

// routeEnvd adds envd's own endpoints to mux (the envd mux): /health,
// and the process service (process.go).
func (h *Handler) routeEnvd(mux *http.ServeMux) {
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	h.routeProcess(mux)
}
