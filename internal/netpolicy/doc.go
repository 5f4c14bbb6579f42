// Package netpolicy is the grammar and the checks of a run's network
// policy, in one place for the task, the config, the image fetcher, the
// proxy and the result: allowlist entries (host names, "*." wildcards,
// ports), the addresses an egress may reach (CheckAddr and its ranges),
// services' URLs, headers and rules (methods, path globs, and the request
// paths they match), and the report of what a run's network did.
//
// It decides and records nothing itself; it never touches the network, a
// namespace or a file, and imports only the standard library, x/text and
// internal/untrusted.
package netpolicy
