// Package names checks the names agentrun takes (task and session ids,
// config keys' names, registry hosts) byte by byte: a regular expression
// would be compiled again in every process, every container's init
// included.
package names

import "strings"

// Only reports whether every byte of s is one of A-Z a-z 0-9 or of extra.
func Only(s, extra string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') && strings.IndexByte(extra, c) < 0 {
			return false
		}
	}
	return true
}
