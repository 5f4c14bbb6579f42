package config

import (
	"fmt"
	"net"
	"strings"
)

// Addr is a server address as server.listen and --server write it, parsed:
// unix:///absolute/path.sock or tcp://host:port.
type Addr struct {
	Network string // "unix" or "tcp"
	Address string // the socket's path, or host:port
}

// ParseAddr parses a server address. It is the one parser of them: the
// config's check, serve's listener and the client all use it.
func ParseAddr(s string) (Addr, error) {
	if p, ok := strings.CutPrefix(s, "unix://"); ok {
		if !isCleanAbs(p) {
			return Addr{}, fmt.Errorf("%q: socket path must be absolute", s)
		}
		return Addr{Network: "unix", Address: p}, nil
	}
	if hp, ok := strings.CutPrefix(s, "tcp://"); ok {
		if _, port, err := net.SplitHostPort(hp); err == nil && port != "" {
			return Addr{Network: "tcp", Address: hp}, nil
		}
	}
	return Addr{}, fmt.Errorf("%q: want unix:///path/to.sock or tcp://host:port", s)
}

// String is the address as written.
func (a Addr) String() string { return a.Network + "://" + a.Address }
