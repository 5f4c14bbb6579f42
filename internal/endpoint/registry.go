package endpoint

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentrun/agentrun/internal/names"
)

// Registry is one registry host entry, checked as it is read: "host",
// "host:port" or an IP address with a port ("127.0.0.1:5000",
// "[::1]:5000"); "docker.io" is Docker Hub. policy.registries is read
// into them as the config is decoded.
type Registry struct {
	text string // as written
	key  string // what pulls compare (Key)
}

// ParseRegistry checks one registry host entry (CheckRegistry).
func ParseRegistry(s string) (Registry, error) {
	if err := CheckRegistry(s); err != nil {
		return Registry{}, err
	}
	key := s
	if key == dockerHubAlias {
		key = dockerHub
	}
	return Registry{text: s, key: key}, nil
}

// Docker Hub's registry, as go-containerregistry names it (its
// name.DefaultRegistry), and the name an entry may give it.
const (
	dockerHub      = "index.docker.io"
	dockerHubAlias = "docker.io"
)

// String is the entry as written.
func (r Registry) String() string { return r.text }

// Key is the registry as a pull names it (go-containerregistry's
// name.Registry.RegistryStr): the entry as written, but "docker.io",
// which is "index.docker.io".
func (r Registry) Key() string { return r.key }

// UnmarshalText reads an entry by ParseRegistry's rules.
func (r *Registry) UnmarshalText(b []byte) error {
	v, err := ParseRegistry(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// MarshalText writes the entry as it was written.
func (r Registry) MarshalText() ([]byte, error) { return []byte(r.text), nil }

// isHostname reports whether s is dot-separated labels of A-Z a-z 0-9 and
// inner hyphens (checked byte by byte, package names: a regular expression
// would be compiled at every start of the binary, every container's init
// included).
func isHostname(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' || !names.Only(label, "-") {
			return false
		}
	}
	return true
}

// CheckRegistry checks one registry host entry (ParseRegistry): a host
// name or an IP address, and a port from 1 to 65535, that together are a
// URI authority (RFC 3986), as go-containerregistry's strict
// name.NewRegistry wants them.
func CheckRegistry(entry string) error {
	bad := fmt.Errorf("%q: want a registry host name, host:port or ip:port", entry)
	host, port := entry, ""
	if h, p, err := net.SplitHostPort(entry); err == nil {
		host, port = h, p
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return bad
		}
	}
	if _, err := netip.ParseAddr(host); err != nil && !isHostname(host) {
		return bad
	}
	if u, err := url.Parse("//" + entry); err != nil || u.Host != entry {
		return fmt.Errorf("%q: registries must be valid RFC 3986 URI authorities: %s", entry, entry)
	}
	return nil
}
