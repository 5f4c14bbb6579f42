package config

import (
	"strings"

	"github.com/agentrun/agentrun/internal/names"
)

// The names a config holds are checked byte by byte (package names): a
// regular expression would be compiled again by every process that loads
// a config (every cold run), and {1,64} alone is hundreds of allocations.

// isName reports whether s has min to max bytes, each one of A-Z a-z 0-9
// or of extra.
func isName(s string, min, max int, extra string) bool {
	return len(s) >= min && len(s) <= max && names.Only(s, extra)
}

// isEnvName: [A-Za-z_][A-Za-z0-9_]*.
func isEnvName(s string) bool {
	return s != "" && !('0' <= s[0] && s[0] <= '9') && isName(s, 1, len(s), "_")
}

// isLanguageName: 1 to 64 of A-Z a-z 0-9 . _ + -.
func isLanguageName(s string) bool { return isName(s, 1, 64, "._+-") }

// isServiceName: [a-z0-9][a-z0-9_-]{0,62}.
func isServiceName(s string) bool {
	if !isName(s, 1, 63, "_-") || s[0] == '_' || s[0] == '-' {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool { return 'A' <= r && r <= 'Z' }) < 0
}

// isPythonModule: a dotted Python module name, each of its parts
// [A-Za-z_][A-Za-z0-9_]*.
func isPythonModule(s string) bool {
	for part := range strings.SplitSeq(s, ".") {
		if !isEnvName(part) {
			return false
		}
	}
	return true
}

// isNATSName: 1 to 64 of A-Z a-z 0-9 _ -.
func isNATSName(s string) bool { return isName(s, 1, 64, "_-") }

// isNATSSubject: tokens of A-Z a-z 0-9 _ - joined by dots.
func isNATSSubject(s string) bool {
	for tok := range strings.SplitSeq(s, ".") {
		if !isName(tok, 1, len(tok), "_-") {
			return false
		}
	}
	return true
}
