// Package spec builds the hardened OCI runtime spec of a sandbox run.
//
// The spec starts locked down (Default) and is changed only by small options,
// one per concern; Validate checks the composed spec before any backend sees
// it. A spec from this package never shares a namespace with the host, never
// grants a capability and never mounts the root writable.
package spec
