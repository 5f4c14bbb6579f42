//go:build !linux

package proxy

import (
	"context"
	"net"
)

// untilHangup returns a context that ends with ctx: only Linux watches
// the client for its hangup.
func untilHangup(ctx context.Context, _ net.Conn) (context.Context, func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	return hctx, func() { cancel(nil) }
}
