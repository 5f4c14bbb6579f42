package approvals

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"
)

// NewID is a fresh approval id: "ap-" and 64 random bits in hex, which
// no one can guess (a worker listens for its decision on a subject named
// after it).
func NewID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ap-" + hex.EncodeToString(b[:])
}

// End is how the wait for a decision on a hold ended.
type End int

const (
	// Answered: the approver answered in time, or was told that its
	// decision was taken (Decision.Taken).
	Answered End = iota
	// TimedOut: the approval timeout passed with no decision taken.
	TimedOut
	// Withdrawn: the request or call was abandoned (its context ended)
	// with no decision taken.
	Withdrawn
)

// Timeout is the approval timeout d names: d, or DefaultTimeout when d is
// 0 or less.
func Timeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultTimeout
	}
	return d
}

// Ask holds a until approve decides, the approval timeout passes
// (Timeout(timeout)) or ctx ends, and says how the hold ended. A decision taken counts as it was told, even when the time
// ran out (or ctx ended) between taking it and returning; any other
// answer counts only while the hold lasts, and with End TimedOut or
// Withdrawn the Decision is no one's.
func Ask(ctx context.Context, approve Func, a Approval, timeout time.Duration) (Decision, End) {
	actx, cancel := context.WithTimeout(ctx, Timeout(timeout))
	defer cancel()
	d := approve(actx, a)
	switch {
	case !d.Taken && errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		return d, TimedOut
	case !d.Taken && actx.Err() != nil:
		return d, Withdrawn
	}
	return d, Answered
}
