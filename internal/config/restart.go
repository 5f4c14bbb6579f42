package config

import (
	"reflect"
	"slices"
)

// restartKeys are the parts of the config that a running serve cannot
// take from a reload: the socket, the directories, the audit log, runsc,
// the network and what the runner fixes at its start. Each says whether
// two configs agree on it.
var restartKeys = []struct {
	name string
	same func(a, b *Config) bool
}{
	{"server.listen", func(a, b *Config) bool { return a.Server.Listen == b.Server.Listen }},
	{"state_dir", func(a, b *Config) bool { return a.StateDir == b.StateDir }},
	{"store_dir", func(a, b *Config) bool { return a.StoreDir == b.StoreDir }},
	{"store_max_size", func(a, b *Config) bool { return a.StoreMax == b.StoreMax }},
	{"audit", func(a, b *Config) bool { return a.Audit == b.Audit }},
	{"runsc", func(a, b *Config) bool { return reflect.DeepEqual(a.Runsc, b.Runsc) }},
	{"network", func(a, b *Config) bool { return reflect.DeepEqual(a.Network, b.Network) }},
	{"init", func(a, b *Config) bool { return a.Init == b.Init }},
	{"sessions", func(a, b *Config) bool { return a.Sessions == b.Sessions }},
	{"run_uids", func(a, b *Config) bool { return a.RunUIDs == b.RunUIDs }},
	{"policy.registries", func(a, b *Config) bool { return slices.Equal(a.Policy.Registries, b.Policy.Registries) }},
}

// RestartOnly names the keys that differ between cur and next and that
// only a restart of serve applies (server.listen, state_dir, ..., in a
// fixed order); none when next can replace cur in a running serve.
func RestartOnly(cur, next *Config) []string {
	var keys []string
	for _, k := range restartKeys {
		if !k.same(cur, next) {
			keys = append(keys, k.name)
		}
	}
	return keys
}

// NeedsToken says whether a socket of network ("tcp" or "unix", as
// server.listen spells it) lacks the server.token that every request on
// a TCP socket must carry: the API is never open to the network without
// one.
func (s *Server) NeedsToken(network string) bool {
	return network == "tcp" && s.Token == ""
}
