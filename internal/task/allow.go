package task

import (
	"fmt"
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

func canonicalAllow(entry string) (string, error) {
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
