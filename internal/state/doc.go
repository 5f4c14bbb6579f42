// Package state is agentrun's crash-recovery protocol: how a run marks what
// it makes on the host so that, if the agentrun that made it dies, however
// it dies, `agentrun gc` (and serve at start) finds and removes it, and
// never touches a run that is still live.
//
// # Layout
//
// Under the config's state_dir:
//
//	gc.lock           held shared by a run while it registers, exclusively by gc
//	runs/<id>/        one run's host-side set-up: lock, rootfs overlay
//	                  (upper, work, rootfs), workspace, resolv.conf, hosts
//	runs/<id>/lock    held exclusively by the run for its whole life
//	runc/<id>/        libcontainer's state of the run's container
//	runc/cgroup.lock  the libcontainer cgroup-parent lock
//	runsc/<id>/       the run's OCI bundle for runsc, and runsc.log
//	runsc/root/       runsc's own state (--root)
//	runsc/cgroup.lock the runsc cgroup-parent lock
//	sessions/<id>/    mount points of kept session disks (the session store's)
//	seccomp/          the compiled seccomp programs (runtime/runc's cache)
//	launcher/         the run launcher's bytecode per image and interpreter
//	                  (internal/runner's cache)
//
// # Naming
//
// A run id is "ar-" and 16 hex digits (no other name in runs/ or in a
// backend's state dir is ever touched). Its cgroup is <parent>/<id> in
// every hierarchy, where the parent is the backend's (Traits.CgroupParent):
// /agentrun for libcontainer, /agentrun-runsc for runsc.
//
// # Protocol
//
// A run registers before it makes anything (Register): holding gc.lock
// shared, it creates runs/<id> and takes runs/<id>/lock exclusively, without
// waiting. It holds that lock until everything it made is gone, and removes
// runs/<id> last. The kernel drops the lock when the process dies.
//
// GC holds gc.lock exclusively, so that no run registers meanwhile, and
// lists the ids in runs/ and in each backend's state dir. A run whose lock
// it can take (Claim) is dead: gc removes its container (each backend's
// Cleanup, which kills its processes and removes its cgroup and state),
// then the mounts under its run dir, then the dir. A run whose lock is held
// is live and left alone.
//
// A backend's runs share one parent cgroup, which the first run makes and
// every run keeps; `agentrun gc` removes it where it is empty
// (RemoveCgroupParent). Creating a run's cgroup holds the backend's
// cgroup-parent lock shared; removing the parent holds it exclusively
// (LockCgroupParent), so that a parent is never removed under a cgroup
// being made in it.
//
// Every lock here is a flock(2) lock taken through Lock: per open file, so
// that two holders in one process exclude each other as two processes do.
// Flock is agentrun's one flock call; the image store's and the audit log's
// locks, which are not part of this protocol, take theirs through it too.
package state
