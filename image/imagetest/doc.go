// Package imagetest builds images, in-process registries, OCI layouts,
// docker archives and hostile layers for tests of agentrun's packages.
//
// It never reaches the network: registries are in-process, on 127.0.0.1.
// Production code never imports it.
package imagetest
