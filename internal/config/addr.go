package config

import (
	"fmt"
	"net"
	"strings"
)

// Addr is a server address as server.listen and --server write it, parsed:
// unix:///absolute/path.sock or tcp://host:port. server.listen is read
// into one as the config is decoded.
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

// MustAddr is ParseAddr of an address known to be good (a default's).
func MustAddr(s string) Addr {
	a, err := ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

// String is the address as written.
func (a Addr) String() string { return a.Network + "://" + a.Address }

// UnmarshalText reads an address by ParseAddr's rules.
func (a *Addr) UnmarshalText(b []byte) error {
	v, err := ParseAddr(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// MarshalText writes the address as String does.
func (a Addr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }
