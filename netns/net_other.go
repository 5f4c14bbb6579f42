//go:build !linux

package netns

import (
	"context"
	"errors"
	"net"
)

type nsFD int

var errUnsupported = errors.New("network namespaces need linux")

// Setup is only supported on Linux.
func (p *Subnets) Setup() (*Net, error) { return nil, errUnsupported }

// Loopback is only supported on Linux.
func Loopback() (*Net, error) { return nil, errUnsupported }

// Listen is only supported on Linux.
func (n *Net) Listen(network, addr string) (net.Listener, error) { return nil, errUnsupported }

// ListenPacket is only supported on Linux.
func (n *Net) ListenPacket(network, addr string) (net.PacketConn, error) {
	return nil, errUnsupported
}

// DialContext is only supported on Linux.
func (n *Net) DialContext(ctx context.Context, w Which, network, addr string) (net.Conn, error) {
	return nil, errUnsupported
}

// Do is only supported on Linux.
func (n *Net) Do(w Which, fn func() error) error { return errUnsupported }

// Close is only supported on Linux.
func (n *Net) Close() error { return nil }
