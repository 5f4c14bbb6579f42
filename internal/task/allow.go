package task

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/netpolicy"
)

// checkAllow checks network.allow entries ("name", "*.suffix", each with an
// optional ":port" 1-65535; see netpolicy.CanonicalAllow) and returns them
// parsed, lowercased, canonical and deduplicated; nil when there are none.
// Any entry while the policy forbids network is errkind.ErrPolicy.
func checkAllow(entries []string, allowNetwork *bool) (*netpolicy.Allowlist, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	if allowNetwork == nil || !*allowNetwork {
		return nil, &Error{Field: "network.allow", Reason: "network access is not allowed by policy", Err: errkind.ErrPolicy}
	}
	if len(entries) > MaxAllow {
		return nil, errorf("network.allow", "%d entries, more than the maximum %d", len(entries), MaxAllow)
	}
	out := make([]string, 0, len(entries))
	seen := map[string]bool{}
	for i, e := range entries {
		canon, err := netpolicy.CanonicalAllow(e)
		if err != nil {
			return nil, errorf(fmt.Sprintf("network.allow[%d]", i), "%q: %v", e, err)
		}
		if !seen[canon] {
			seen[canon] = true
			out = append(out, canon)
		}
	}
	a, err := netpolicy.ParseAllow(out)
	if err != nil { // never: each canonical entry parses
		return nil, errorf("network.allow", "%v", err)
	}
	return a, nil
}

// checkServices checks network.services: names of the config's services,
// deduplicated. Any while the policy forbids network is errkind.ErrPolicy.
func checkServices(names []string, cfg *config.Config) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if an := cfg.Policy.AllowNetwork; an == nil || !*an {
		return nil, &Error{Field: "network.services", Reason: "network access is not allowed by policy", Err: errkind.ErrPolicy}
	}
	if len(names) > config.MaxServices {
		return nil, errorf("network.services", "%d entries, more than the maximum %d", len(names), config.MaxServices)
	}
	var out []string
	for i, n := range names {
		if _, ok := cfg.Network.Services[n]; !ok {
			known := slices.Sorted(maps.Keys(cfg.Network.Services))
			if len(known) == 0 {
				return nil, &Error{Field: fmt.Sprintf("network.services[%d]", i), Reason: fmt.Sprintf("%q: the config declares no services", n), Err: errkind.ErrPolicy}
			}
			return nil, &Error{Field: fmt.Sprintf("network.services[%d]", i), Reason: fmt.Sprintf("%q is not a service of the config (known: %s)", n, strings.Join(known, ", ")), Err: errkind.ErrPolicy}
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// checkTools checks tools: names of the config's tool servers,
// deduplicated. Tools are reached through agentrun's broker, not the
// network, so a policy without network still allows them.
func checkTools(names []string, cfg *config.Config) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if len(names) > config.MaxTools {
		return nil, errorf("tools", "%d entries, more than the maximum %d", len(names), config.MaxTools)
	}
	var out []string
	for i, n := range names {
		if _, ok := cfg.Tools[n]; !ok {
			known := slices.Sorted(maps.Keys(cfg.Tools))
			if len(known) == 0 {
				return nil, &Error{Field: fmt.Sprintf("tools[%d]", i), Reason: fmt.Sprintf("%q: the config declares no tools", n), Err: errkind.ErrPolicy}
			}
			return nil, &Error{Field: fmt.Sprintf("tools[%d]", i), Reason: fmt.Sprintf("%q is not a tool server of the config (known: %s)", n, strings.Join(known, ", ")), Err: errkind.ErrPolicy}
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}
