package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// E2B configures serve's E2B door (spec §18, docs/e2b.md): the templates
// an E2B SDK may name, each an image, and the API keys it may present,
// each read from a root-only file and acting as the serve user of its
// name. With no key, the door answers every call 401.
type E2B struct {
	// Templates maps an E2B template name ("base", "code-interpreter-v1")
	// to the image a sandbox of it runs.
	Templates map[string]string `json:"templates"`
	// Keys maps a serve user to its key's file.
	Keys map[string]E2BKey `json:"keys"`
	// Domain, when set, is a domain whose names PORT-ID reach an E2B
	// sandbox's port (the SDK's getHost, and envd's at 49983 without
	// E2B_SANDBOX_URL): the operator points *.DOMAIN at serve.
	Domain string `json:"domain,omitempty"`
}

// E2BKey is one E2B API key: File is a root-only file (owner root, mode
// 0600 or 0400) of one line, the key, read by serve at its start and at
// each reload.
type E2BKey struct {
	File string `json:"file"`
}

// Bounds of the e2b section.
const (
	MaxE2BTemplates = 256
	MaxE2BKeys      = 1024
)

// KeyNames is the users of the keys, sorted.
func (e E2B) KeyNames() []string {
	names := make([]string, 0, len(e.Keys))
	for n := range e.Keys {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// validate checks e; preview is server.preview_domain, which e.Domain
// may not be.
func (e E2B) validate(preview string) error {
	if len(e.Templates) > MaxE2BTemplates {
		return fieldErr("e2b.templates", fmt.Errorf("%d templates: at most %d", len(e.Templates), MaxE2BTemplates))
	}
	for name, img := range e.Templates {
		field := "e2b.templates." + name
		// E2B's template ids and names: letters, digits, "-", "_", "."
		// and a ":tag" or "/team" part.
		if !isName(name, 1, 128, "-_.:/") {
			return fieldErr(field, fmt.Errorf("%q is not a template name (1 to 128 of letters, digits and -_.:/)", name))
		}
		if err := CheckImage(img); err != nil {
			return fieldErr(field, err)
		}
	}
	if e.Domain != "" {
		if _, err := netip.ParseAddr(e.Domain); err == nil {
			return fieldErr("e2b.domain", fmt.Errorf("%q: an IP address; want a domain name", e.Domain))
		}
		if err := netpolicy.CheckHostname(e.Domain); err != nil {
			return fieldErr("e2b.domain", fmt.Errorf("want a domain name, without scheme, port or wildcard: %w", err))
		}
		if strings.EqualFold(strings.TrimSuffix(e.Domain, "."), strings.TrimSuffix(preview, ".")) {
			return fieldErr("e2b.domain", fmt.Errorf("%q is server.preview_domain too: each needs its own", e.Domain))
		}
	}
	if len(e.Keys) > MaxE2BKeys {
		return fieldErr("e2b.keys", fmt.Errorf("%d keys: at most %d", len(e.Keys), MaxE2BKeys))
	}
	for user, k := range e.Keys {
		field := "e2b.keys." + user
		if !isName(user, 1, 64, "-_.") || strings.HasPrefix(user, ".") {
			return fieldErr(field, fmt.Errorf("%q is not a user name (1 to 64 of letters, digits and -_., not starting with .)", user))
		}
		if !isCleanAbs(k.File) {
			return fieldErr(field+".file", fmt.Errorf("%q is not a clean absolute path (the key's root-only file)", k.File))
		}
	}
	return nil
}
