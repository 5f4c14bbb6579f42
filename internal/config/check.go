package config

import (
	"errors"
	"fmt"
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
	case !isEnvName(name):
		return fmt.Errorf("invalid variable name %q: want [A-Za-z_][A-Za-z0-9_]*", name)
	case IsReservedEnv(name):
		return fmt.Errorf("%s is reserved: agentrun sets it", name)
	case strings.ContainsRune(value, 0):
		return errors.New("value contains NUL")
	}
	return nil
}

// LocalImagePrefixes are the reference forms that name a path on the host.
var LocalImagePrefixes = []string{"dir:", "oci:", "docker-archive:"}

// LocalImagePath returns the host path a local image reference names
// (for oci: and docker-archive:, without a trailing ":tag"), and whether
// ref is local at all.
func LocalImagePath(ref string) (string, bool) {
	for _, p := range LocalImagePrefixes {
		if rest, ok := strings.CutPrefix(ref, p); ok {
			if p != "dir:" {
				// A tag follows the last ':' after the last '/'.
				if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
					rest = rest[:i]
				}
			}
			return rest, true
		}
	}
	return "", false
}

// CheckLocalImage refuses a local image reference whose path is not
// absolute and clean, or not under one of dirs.
func CheckLocalImage(ref string, dirs []string) error {
	path, ok := LocalImagePath(ref)
	if !ok {
		return nil
	}
	if !isCleanAbs(path) {
		return fmt.Errorf("%q: a local image path must be absolute and clean", ref)
	}
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, strings.TrimSuffix(d, "/")+"/") {
			return nil
		}
	}
	if len(dirs) == 0 {
		return fmt.Errorf("%q: tasks may not name local images (config policy.local_images lists none)", ref)
	}
	// The refusal goes to whoever sent the task: it names the config key,
	// never the host directories it lists.
	return fmt.Errorf("%q is not under a directory of config policy.local_images", ref)
}
