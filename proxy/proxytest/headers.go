package proxytest

import (
	"net/http"
	"sync"
)

// HeaderLog records one header of each request an upstream handler gets,
// for tests that check what reached the upstream (and what did not).
type HeaderLog struct {
	Name string // the header recorded

	mu   sync.Mutex
	seen []string
}

// Record notes r's header.
func (l *HeaderLog) Record(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, r.Header.Get(l.Name))
}

// Got returns the values recorded so far, oldest first.
func (l *HeaderLog) Got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}
