// Package endpoint is the syntax of the places outside the host that the
// config names for agentrun to reach on the operator's say-so: a registry
// host of policy.registries (Registry) and an approval webhook's URL
// (CheckWebhook), and how such a URL is shown in logs and errors
// (Redact). The config checks its values with it as it reads them; the
// image store and the approvals webhook take the values checked.
//
// It checks and shows, and never dials: it imports the standard library
// alone, so that the config and every door that reads it build without
// the image store and its registry client.
package endpoint
