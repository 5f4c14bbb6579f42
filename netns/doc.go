// Package netns gives each run a private pair of anonymous network
// namespaces, sandbox and gateway, joined by one veth pair on a /30 subnet.
//
// It never leaves a namespace or veth on the host: both namespaces are held
// only by file descriptors (nothing under /run/netns), the veth is created
// directly inside them, and Close removes all of it.
package netns
