package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
)

// apiError is E2B's error body: the SDKs read message and code.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// WriteError answers status with E2B's error body.
func WriteError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// writeRetry answers 429 with Retry-After, which the SDKs wait for.
func writeRetry(w http.ResponseWriter, after time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(after.Round(time.Second)/time.Second))))
	WriteError(w, http.StatusTooManyRequests, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errEOF is what a decoder says of an empty body.
var errEOF = io.EOF
