package task

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
)

// checkAllow checks network.allow entries ("name", "*.suffix", each with an
// optional ":port" 1-65535) and returns them lowercased, canonical and
// deduplicated. Any entry while the policy forbids network is ErrPolicy.
func checkAllow(entries []string, allowNetwork *bool) ([]string, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	if allowNetwork == nil || !*allowNetwork {
		return nil, &Error{Field: "network.allow", Reason: "network access is not allowed by policy", Err: ErrPolicy}
	}
	if len(entries) > MaxAllow {
		return nil, errorf("network.allow", "%d entries, more than the maximum %d", len(entries), MaxAllow)
	}
	out := make([]string, 0, len(entries))
	seen := map[string]bool{}
	for i, e := range entries {
		canon, err := canonicalAllow(e)
		if err != nil {
			return nil, errorf(fmt.Sprintf("network.allow[%d]", i), "%q: %v", e, err)
		}
		if !seen[canon] {
			seen[canon] = true
			out = append(out, canon)
		}
	}
	return out, nil
}

// checkServices checks network.services: names of the config's services,
// deduplicated. Any while the policy forbids network is ErrPolicy.
func checkServices(names []string, cfg *config.Config) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if an := cfg.Policy.AllowNetwork; an == nil || !*an {
		return nil, &Error{Field: "network.services", Reason: "network access is not allowed by policy", Err: ErrPolicy}
	}
	if len(names) > config.MaxServices {
		return nil, errorf("network.services", "%d entries, more than the maximum %d", len(names), config.MaxServices)
	}
	var out []string
	for i, n := range names {
		if _, ok := cfg.Network.Services[n]; !ok {
			known := slices.Sorted(maps.Keys(cfg.Network.Services))
			if len(known) == 0 {
				return nil, &Error{Field: fmt.Sprintf("network.services[%d]", i), Reason: fmt.Sprintf("%q: the config declares no services", n), Err: ErrPolicy}
			}
			return nil, &Error{Field: fmt.Sprintf("network.services[%d]", i), Reason: fmt.Sprintf("%q is not a service of the config (known: %s)", n, strings.Join(known, ", ")), Err: ErrPolicy}
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func canonicalAllow(entry string) (string, error) {
	if hint, ok := urlHost(entry); ok {
		return "", fmt.Errorf("a URL, not a host name: give the host name alone (%q), with an optional \":port\"", hint)
	}
	host, port, hasPort := strings.Cut(strings.ToLower(entry), ":")
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '+' {
			return "", fmt.Errorf("port must be a number 1-65535")
		}
		port = ":" + strconv.Itoa(n)
	}
	name := strings.TrimPrefix(host, "*.")
	if strings.Contains(name, "*") {
		return "", fmt.Errorf("a wildcard is only allowed as a leading \"*.\"")
	}
	if err := config.CheckHostname(name); err != nil {
		return "", fmt.Errorf("want a host name or \"*.\" + host name, with an optional \":port\": %w", err)
	}
	return host + port, nil
}

// urlHost reports whether entry looks like a URL or a host with a path
// ("https://pypi.org", "pypi.org/simple") and returns the host name it
// names, for the error. Such entries are refused, not normalized: a
// scheme would suggest a port or protocol restriction the allowlist does
// not make.
func urlHost(entry string) (string, bool) {
	rest := entry
	if _, after, ok := strings.Cut(entry, "://"); ok {
		rest = after
	} else if !strings.Contains(entry, "/") {
		return "", false
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	return strings.ToLower(rest), true
}
