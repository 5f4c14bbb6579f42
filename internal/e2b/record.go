package e2b

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/runapi"
)

// record is what the door keeps of one E2B sandbox beside the live
// sandbox: what E2B shows of it and its tokens.
type record struct {
	id, user, template string
	metadata           map[string]string
	envdToken          string // X-Access-Token, on every call into it
	trafficToken       string // E2b-Traffic-Access-Token, on its other ports
	started            time.Time
	cpus, memoryMB     int
	allowOut, denyOut  []string

	mu   sync.Mutex
	kept map[any]any
	gone bool
}

// newToken is a fresh token of 128 random bits.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// release closes what handlers kept of the sandbox; later Keeps keep
// nothing.
func (rec *record) release() {
	rec.mu.Lock()
	kept := rec.kept
	rec.kept, rec.gone = nil, true
	rec.mu.Unlock()
	for _, v := range kept {
		if c, ok := v.(io.Closer); ok {
			_ = c.Close()
		}
	}
}

// lookup is the live sandbox of id and the door's record of it, nil if
// there is none or it ended (its record then let go of).
func (h *Handler) lookup(id string) (*record, runapi.Sandbox) {
	h.mu.Lock()
	rec := h.records[id]
	h.mu.Unlock()
	if rec == nil {
		return nil, nil
	}
	sb := h.sandboxes.Get(rec.user, id)
	if sb == nil {
		h.forget(id)
		return nil, nil
	}
	return rec, sb
}

// userSandbox is user's sandbox id and its record, nil if it is none of
// user's: one key never reaches another's sandboxes.
func (h *Handler) userSandbox(user, id string) (*record, runapi.Sandbox) {
	rec, sb := h.lookup(id)
	if rec == nil || rec.user != user {
		return nil, nil
	}
	return rec, sb
}

// forget lets go of id's record.
func (h *Handler) forget(id string) {
	h.mu.Lock()
	rec := h.records[id]
	delete(h.records, id)
	h.mu.Unlock()
	if rec != nil {
		rec.release()
	}
}

// prune lets go of the records of sandboxes that ended (expired, or
// ended by serve's own API), so that they are never more than the live.
func (h *Handler) prune() {
	h.mu.Lock()
	var ended []string
	for id, rec := range h.records {
		if h.sandboxes.Get(rec.user, id) == nil {
			ended = append(ended, id)
		}
	}
	h.mu.Unlock()
	for _, id := range ended {
		h.forget(id)
	}
}
