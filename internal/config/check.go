package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// MaxImageLen bounds an image reference.
const MaxImageLen = 1024

// CheckImage checks an image reference's syntax only: non-empty, at most
// MaxImageLen bytes, no whitespace, control characters or NUL.
func CheckImage(ref string) error {
	switch {
	case ref == "":
		return errors.New("image is required")
	case len(ref) > MaxImageLen:
		return fmt.Errorf("longer than %d bytes", MaxImageLen)
	case strings.ContainsFunc(ref, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return fmt.Errorf("%q contains whitespace or control characters", ref)
	}
	return nil
}

// CheckRuntime accepts "libcontainer" and "runsc".
func CheckRuntime(name string) error {
	if name != RuntimeLibcontainer && name != RuntimeRunsc {
		return fmt.Errorf("%q is not a runtime (want %q or %q)", name, RuntimeLibcontainer, RuntimeRunsc)
	}
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are set by agentrun itself (HOME, PATH) or by its network
// layer (the proxy variables); a task or config may not set them.
var reservedEnv = map[string]bool{
	"PATH": true, "HOME": true,
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "NO_PROXY": true,
	"http_proxy": true, "https_proxy": true, "no_proxy": true,
}

// IsReservedEnv reports whether agentrun sets the variable name itself:
// PATH, HOME, the proxy variables and every AGENTRUN_* name.
func IsReservedEnv(name string) bool {
	return reservedEnv[name] || strings.HasPrefix(name, "AGENTRUN_")
}

// CheckEnv checks one environment variable: the name matches
// [A-Za-z_][A-Za-z0-9_]* and is not reserved, the value has no NUL.
func CheckEnv(name, value string) error {
	switch {
	case !envName.MatchString(name):
		return fmt.Errorf("invalid variable name %q: want [A-Za-z_][A-Za-z0-9_]*", name)
	case IsReservedEnv(name):
		return fmt.Errorf("%s is reserved: agentrun sets it", name)
	case strings.ContainsRune(value, 0):
		return errors.New("value contains NUL")
	}
	return nil
}

// CheckHostname checks DNS host name syntax: at most 253 bytes of dot-separated
// labels of 1-63 letters, digits and inner hyphens, the last label not all
// digits (so IP addresses are refused). No trailing dot.
func CheckHostname(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%q: host name must be 1-253 characters", name)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q: each dot-separated label must be 1-63 characters, not starting or ending with '-'", name)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("%q: invalid character %q in host name", name, c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("%q: IP addresses are not host names", name)
	}
	return nil
}
