package e2b

import "net/http"

// routeInterpreter fills mux, the code interpreter's (port 49999):
// /execute and /contexts. Its handlers get their call with CallOf (see
// the package doc).
func (h *Handler) routeInterpreter(mux *http.ServeMux) {
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, "the code interpreter is not served by this agentrun yet")
	})
}
