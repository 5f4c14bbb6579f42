package e2b

import "net/http"

// routeProcess adds envd's process service to mux.
func (h *Handler) routeProcess(mux *http.ServeMux) {}
