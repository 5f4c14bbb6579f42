// Package sandbox owns a live sandbox's life, processes and files (spec
// §17): a sandbox set up with every guarantee of a run, whose processes
// may outlive the request that started them, never the sandbox. The
// runner owns a run; both stand on the backend interface
// (runtime/backend.Live starts a process inside a running container).
//
// A Sandbox is made by Create from a runner.Live, whose program (the
// image's own shell, looping on sleep) holds it up as its init's child.
// It ends at its lifetime (Options.Lifetime, extended by SetTimeout up
// to Options.MaxLifetime from its creation), on Close, or when its
// holder dies: the whole cgroup is killed and everything torn down as
// after a run. Its files are reached only through the workspace's
// link-safe methods (internal/safefs). A Set keeps the live sandboxes of
// a server, per user, within a bound.
package sandbox
