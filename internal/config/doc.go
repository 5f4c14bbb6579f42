// Package config loads, merges and validates agentrun's host configuration file (task defaults, policy maxima, languages, network, server and paths).
package config
