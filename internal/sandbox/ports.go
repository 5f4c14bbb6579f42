package sandbox

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/agentrun/agentrun/internal/errkind"
)

// MaxPortConns bounds the connections to a sandbox's ports open at once
// (a variable for the tests).
var MaxPortConns = 64

// ErrPortConns is wrapped by the refusal of a connection past
// MaxPortConns.
var ErrPortConns = errkind.New(errkind.Unavailable, "too many connections to the sandbox's ports")

// ports are a sandbox's open connections to its ports, closed with it.
type ports struct {
	mu     sync.Mutex
	conns  map[*portConn]struct{}
	closed bool
}

// DialPort connects to TCP port inside the sandbox (its loopback, from
// its own network namespace), within MaxPortConns; the connection is
// closed when the sandbox ends.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	s.ports.mu.Lock()
	switch {
	case s.ports.closed:
		s.ports.mu.Unlock()
		return nil, ErrEnded
	case len(s.ports.conns) >= MaxPortConns:
		s.ports.mu.Unlock()
		return nil, fmt.Errorf("%w: %d are open", ErrPortConns, MaxPortConns)
	}
	// The place is taken before the dial.
	pc := &portConn{p: &s.ports}
	if s.ports.conns == nil {
		s.ports.conns = map[*portConn]struct{}{}
	}
	s.ports.conns[pc] = struct{}{}
	s.ports.mu.Unlock()
	c, err := s.live.DialPort(ctx, port)
	if err != nil {
		pc.release()
		return nil, errkind.Mark(errkind.Upstream, err)
	}
	s.ports.mu.Lock()
	if s.ports.closed { // ended during the dial: closeAll left this one
		s.ports.mu.Unlock()
		_ = c.Close()
		pc.release()
		return nil, ErrEnded
	}
	pc.Conn = c
	s.ports.mu.Unlock()
	return pc, nil
}

// closeAll closes every connection, and takes none from now on.
func (p *ports) closeAll() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*portConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// portConn is a connection to a port, in its sandbox's ports.
type portConn struct {
	net.Conn // nil until dialled
	p        *ports
	once     sync.Once
}

func (c *portConn) release() {
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
}

// Close closes the connection and gives its place back; one not yet
// dialled is closed by DialPort once it is.
func (c *portConn) Close() error {
	var err error
	c.once.Do(func() {
		c.p.mu.Lock()
		conn := c.Conn
		delete(c.p.conns, c)
		c.p.mu.Unlock()
		if conn != nil {
			err = conn.Close()
		}
	})
	return err
}
