package server

import (
	_ "embed"
	"net/http"
	"strconv"
)

// OpenAPI is the OpenAPI 3.1 document of the API (openapi.json), served at
// GET /v1/openapi.json behind the same token as the rest. It is written by
// hand, once: the tests check every endpoint's real answers against it,
// and its task, result and other schemas against the Go types that encode
// them (field names, JSON types, which are always present), so that
// neither can change without the other.
//
//go:embed openapi.json
var OpenAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(OpenAPI)))
	w.Write(OpenAPI)
}
