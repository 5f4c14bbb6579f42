// Package image resolves image references (registry, OCI layout, docker
// archive, plain directory) into unpacked root filesystems kept in a
// content-addressed store shared read-only by every run.
//
// The store never publishes a rootfs whose layers it has not verified
// against their digests, and its unpacker never writes outside the unpack
// root.
package image
