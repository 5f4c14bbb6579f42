package escape

import (
	"maps"
	"slices"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
)

// expectation is what one runtime is known to answer for one probe. Every
// probe passes on "not success" whatever the errno; the table records where
// runtimes legitimately differ, and which probes must run at all.
type expectation struct {
	// Errnos this runtime is known to give. A blocked probe with another
	// errno is noted in the log, never failed, unless Exact.
	Errnos []string
	// Exact: a blocked probe must give one of Errnos, where the errno is
	// the point: the kernel itself refuses some calls the filter must
	// refuse (a TIOCLINUX on a pty, TCP_ULP with no tls module), and a
	// program falls back on EAFNOSUPPORT as on a kernel without the
	// family.
	Exact bool
	// Info: recorded, never failed, on this runtime.
	Info bool
	// MayNotProbe: why the probe may legitimately not run on this runtime.
	// Any other probe that reports not_probed fails.
	MayNotProbe string
}

// expectations, per runtime (the task's "runtime" field). Every probe named
// in a runtime's table must appear in its report. tcp-host-<ip> probes
// depend on the host's addresses and are not listed.
var expectations = map[string]map[string]expectation{
	config.RuntimeLibcontainer: libcontainer,
	config.RuntimeRunsc:        runsc(),
}

// fileErrnos: opening a /proc, /sys or root file for writing fails with
// EROFS, EACCES (the file's mode, checked first) or ENOENT (the kernel has
// no such file), depending on the file and the kernel's configuration.
var fileErrnos = []string{"EROFS", "EACCES", "ENOENT", "ETXTBSY"}

// noIA32: some hosts' kernels have no IA-32 entry (int 0x80 faults there
// outside any sandbox too, e.g. a PVM guest): nothing to refuse. Where the
// ABI works the i386 probes run and must be refused.
const noIA32 = "the host kernel has no IA-32 entry: int 0x80 faults outside the sandbox too"

// afNoSupport, protoNoSupport and typeNoSupport: a socket family, a
// netlink or inet protocol, or an inet socket type past the kernel
// surface's allowlist fails as on a kernel without it.
var (
	afNoSupport    = []string{"EAFNOSUPPORT"}
	protoNoSupport = []string{"EPROTONOSUPPORT"}
	typeNoSupport  = []string{"ESOCKTNOSUPPORT"}
)

// clone3NoSys: clone3 fails with ENOSYS on both runtimes, whatever its
// flags (which no filter can read): with EPERM glibc would not fall back
// to clone, and no thread would start.
var clone3NoSys = expectation{Errnos: []string{"ENOSYS"}, Exact: true}

// maskedErrnos: a masked path reads empty (no errno) or is absent.
var maskedErrnos = []string{"", "ENOENT"}

// libcontainer as seen on Linux 6.18 (x86-64, cgroup v1) with runc 1.5's
// libcontainer and Docker's default profile minus ptrace/process_vm_*,
// with the kernel surface's allowlist (runtime/spec/surface.go).
var libcontainer = map[string]expectation{
	"uts-hostname":                        {},
	"write-root-newfile":                  {Errnos: fileErrnos},
	"write-etc-passwd":                    {Errnos: fileErrnos},
	"write-probe-binary":                  {Errnos: fileErrnos},
	"mkdir-root":                          {Errnos: []string{"EROFS"}},
	"root-mount-readonly":                 {},
	"tmp-mount-options":                   {},
	"exec-tmp":                            {Errnos: []string{"EACCES"}},
	"exec-workspace":                      {Errnos: []string{"EACCES"}},
	"exec-devshm":                         {Errnos: []string{"EACCES"}},
	"mmap-exec-tmp":                       {Errnos: []string{"EPERM"}},
	"setuid-bit-in-tmp":                   {Errnos: []string{"EACCES"}},
	"exec-memfd":                          {},
	"tmp-enospc":                          {Errnos: []string{"ENOSPC"}},
	"dev-listing":                         {},
	"mknod-block-8-0":                     {Errnos: []string{"EPERM"}},
	"mknod-char-1-1":                      {Errnos: []string{"EPERM"}},
	"mknod-char-1-11":                     {Errnos: []string{"EPERM"}},
	"fd-only-stdio":                       {},
	"fd-stdio-targets":                    {},
	"cwd-inside-root":                     {},
	"proc-self-exe-wronly":                {Errnos: fileErrnos},
	"proc-all-exe-wronly":                 {Errnos: fileErrnos},
	"proc-self-exe-reopen":                {Errnos: fileErrnos},
	"mountinfo-host-paths":                {},
	"mountinfo-image-path":                {},
	"sockets-under-root":                  {},
	"dotdot-root":                         {},
	"procsys-core-pattern":                {Errnos: fileErrnos},
	"procsys-modprobe":                    {Errnos: fileErrnos},
	"procsys-binfmt-register":             {Errnos: fileErrnos},
	"procsys-sysrq":                       {Errnos: fileErrnos},
	"procsys-drop-caches":                 {Errnos: fileErrnos},
	"procsys-hostname":                    {Errnos: fileErrnos},
	"procsys-ip-forward":                  {Errnos: fileErrnos},
	"proc-irq-affinity":                   {Errnos: fileErrnos},
	"procsys-mount-readonly":              {},
	"proc-sysrq-trigger":                  {Errnos: fileErrnos},
	"masked-proc-kcore":                   {Errnos: maskedErrnos},
	"masked-proc-keys":                    {Errnos: maskedErrnos},
	"masked-proc-timer-list":              {Errnos: maskedErrnos},
	"masked-proc-sched-debug":             {Errnos: maskedErrnos},
	"masked-proc-interrupts":              {Errnos: maskedErrnos},
	"masked-proc-latency-stats":           {Errnos: maskedErrnos},
	"masked-proc-timer-stats":             {Errnos: maskedErrnos},
	"masked-proc-acpi":                    {Errnos: maskedErrnos},
	"masked-proc-scsi":                    {Errnos: maskedErrnos},
	"masked-proc-asound":                  {Errnos: maskedErrnos},
	"masked-sys-firmware":                 {Errnos: maskedErrnos},
	"masked-sys-devices-virtual-powercap": {Errnos: maskedErrnos},
	"kallsyms-addresses-hidden":           {},
	"sys-write-kernel-uevent-helper":      {Errnos: fileErrnos},
	"sys-write-kernel-mm-transparent-hugepage-enabled": {Errnos: fileErrnos},
	"sys-write-power-state":                            {Errnos: fileErrnos},
	"sys-write-kernel-profiling":                       {Errnos: fileErrnos},
	"sys-cgroup-release-agent":                         {Errnos: fileErrnos},
	"sys-mount-readonly":                               {},
	"mount-cgroup":                                     {Errnos: []string{"EPERM"}},
	"mount-cgroup2":                                    {Errnos: []string{"EPERM"}},
	"proc-only-sandbox-pids":                           {},
	"status-caps-zero":                                 {},
	"status-nnp-seccomp":                               {},
	"capget-zero":                                      {},
	"prctl-nnp-seccomp":                                {},
	"capbset-empty":                                    {},
	"cap-ambient-raise":                                {Errnos: []string{"EPERM"}},
	"status-ids":                                       {},
	"getres-ids":                                       {},
	"setuid-root-binary":                               {},
	"file-caps-binary":                                 {Errnos: []string{"EPERM"}},
	"file-caps-noeff-binary":                           {},
	"setuid-0":                                         {Errnos: []string{"EPERM"}},
	"setgid-0":                                         {Errnos: []string{"EPERM"}},
	"setresuid-0":                                      {Errnos: []string{"EPERM"}},
	"setgroups-0":                                      {Errnos: []string{"EPERM"}},
	"chroot":                                           {Errnos: []string{"EPERM"}},
	"unshare-user":                                     {Errnos: []string{"EPERM"}},
	"unshare-mnt":                                      {Errnos: []string{"EPERM"}},
	"unshare-net":                                      {Errnos: []string{"EPERM"}},
	"unshare-pid":                                      {Errnos: []string{"EPERM"}},
	"unshare-ipc":                                      {Errnos: []string{"EPERM"}},
	"unshare-uts":                                      {Errnos: []string{"EPERM"}},
	"unshare-cgroup":                                   {Errnos: []string{"EPERM"}},
	"unshare-time":                                     {Errnos: []string{"EPERM"}},
	"clone-newuser":                                    {Errnos: []string{"EPERM"}},
	"clone-newmnt-pid-net":                             {Errnos: []string{"EPERM"}},
	"clone-newmnt":                                     {Errnos: []string{"EPERM"}},
	"clone-newpid":                                     {Errnos: []string{"EPERM"}},
	"clone-newnet":                                     {Errnos: []string{"EPERM"}},
	"clone-newipc":                                     {Errnos: []string{"EPERM"}},
	"clone-newuts":                                     {Errnos: []string{"EPERM"}},
	"clone-newcgroup":                                  {Errnos: []string{"EPERM"}},
	"clone3":                                           clone3NoSys,
	"clone3-newuser-newnet":                            clone3NoSys,
	"clone3-newuser":                                   clone3NoSys,
	"clone3-newmnt":                                    clone3NoSys,
	"clone3-newpid":                                    clone3NoSys,
	"clone3-newnet":                                    clone3NoSys,
	"clone3-newipc":                                    clone3NoSys,
	"clone3-newuts":                                    clone3NoSys,
	"clone3-newcgroup":                                 clone3NoSys,
	"clone3-newtime":                                   clone3NoSys,
	"mount-tmpfs":                                      {Errnos: []string{"EPERM"}},
	"mount-proc":                                       {Errnos: []string{"EPERM"}},
	"mount-bind-root":                                  {Errnos: []string{"EPERM"}},
	"mount-remount-root-rw":                            {Errnos: []string{"EPERM"}},
	"umount2-masked":                                   {Errnos: []string{"EPERM"}},
	"umount2-proc-sys":                                 {Errnos: []string{"EPERM"}},
	"pivot-root":                                       {Errnos: []string{"EPERM"}},
	"fsopen":                                           {Errnos: []string{"EPERM"}},
	"fsconfig":                                         {Errnos: []string{"EPERM"}},
	"fsmount":                                          {Errnos: []string{"EPERM"}},
	"fspick":                                           {Errnos: []string{"EPERM"}},
	"open-tree-clone":                                  {Errnos: []string{"EPERM"}},
	"move-mount":                                       {Errnos: []string{"EPERM"}},
	"mount-setattr-root-rw":                            {Errnos: []string{"EPERM"}},
	"setns-net":                                        {Errnos: []string{"EPERM"}},
	"setns-mnt":                                        {Errnos: []string{"EPERM"}},
	"keyctl":                                           {Errnos: []string{"EPERM"}},
	"add-key":                                          {Errnos: []string{"EPERM"}},
	"request-key":                                      {Errnos: []string{"EPERM"}},
	"userfaultfd":                                      {Errnos: []string{"EPERM"}},
	"io-uring-setup":                                   {Errnos: []string{"EPERM"}},
	"io-uring-enter":                                   {Errnos: []string{"EPERM"}},
	"io-uring-register":                                {Errnos: []string{"EPERM"}},
	"bpf-map-create":                                   {Errnos: []string{"EPERM"}},
	"perf-event-open":                                  {Errnos: []string{"EPERM"}},
	"ptrace-peek-self":                                 {Errnos: []string{"EPERM"}},
	"ptrace-attach-child":                              {Errnos: []string{"EPERM"}},
	"process-vm-readv":                                 {Errnos: []string{"EPERM"}},
	"process-vm-writev":                                {Errnos: []string{"EPERM"}},
	"kexec-load":                                       {Errnos: []string{"EPERM"}},
	"kexec-file-load":                                  {Errnos: []string{"EPERM"}},
	"init-module":                                      {Errnos: []string{"EPERM"}},
	"finit-module":                                     {Errnos: []string{"EPERM"}},
	"delete-module":                                    {Errnos: []string{"EPERM"}},
	"reboot":                                           {Errnos: []string{"EPERM"}},
	"swapon":                                           {Errnos: []string{"EPERM"}},
	"swapoff":                                          {Errnos: []string{"EPERM"}},
	"acct":                                             {Errnos: []string{"EPERM"}},
	"settimeofday":                                     {Errnos: []string{"EPERM"}},
	"clock-settime":                                    {Errnos: []string{"EPERM"}},
	"sethostname":                                      {Errnos: []string{"EPERM"}},
	"setdomainname":                                    {Errnos: []string{"EPERM"}},
	"syslog-read":                                      {Errnos: []string{"EPERM"}},
	"syslog-size":                                      {Errnos: []string{"EPERM"}},
	"iopl":                                             {Errnos: []string{"EPERM"}},
	"ioperm":                                           {Errnos: []string{"EPERM"}},
	"open-by-handle-at":                                {Errnos: []string{"EPERM"}},
	"kcmp":                                             {Errnos: []string{"EPERM"}},
	"uselib":                                           {Errnos: []string{"EPERM"}},
	"vhangup":                                          {Errnos: []string{"EPERM"}},
	"quotactl":                                         {Errnos: []string{"EPERM"}},
	"lookup-dcookie":                                   {Errnos: []string{"EPERM"}},
	"modify-ldt":                                       {},
	"personality-read-implies-exec":                    {Errnos: []string{"EPERM"}},
	"personality-addr-no-randomize":                    {Errnos: []string{"EPERM"}},
	"personality-mmap-page-zero":                       {Errnos: []string{"EPERM"}},
	"nr-1000":                                          {Errnos: []string{"ENOSYS"}},
	"nr-open-tree-attr":                                {Errnos: []string{"ENOSYS"}},
	"nr-file-setattr":                                  {Errnos: []string{"ENOSYS"}},
	"nr-sysctl":                                        {Errnos: []string{"EPERM"}},
	"nr-nfsservctl":                                    {Errnos: []string{"EPERM"}},
	"nr-create-module":                                 {Errnos: []string{"EPERM"}},
	"x32-unshare":                                      {Errnos: []string{"SIGSYS"}},
	"x32-mount":                                        {Errnos: []string{"SIGSYS"}},
	"x32-keyctl":                                       {Errnos: []string{"SIGSYS"}},
	"x32-setuid":                                       {Errnos: []string{"SIGSYS"}},
	"x32-getpid":                                       {Errnos: []string{"SIGSYS"}},
	"i386-unshare":                                     {Errnos: []string{"SIGSYS"}, MayNotProbe: noIA32},
	"i386-mount":                                       {Errnos: []string{"SIGSYS"}, MayNotProbe: noIA32},
	"i386-keyctl":                                      {Errnos: []string{"SIGSYS"}, MayNotProbe: noIA32},
	"i386-setuid32":                                    {Errnos: []string{"SIGSYS"}, MayNotProbe: noIA32},
	"i386-ptrace":                                      {Errnos: []string{"SIGSYS"}, MayNotProbe: noIA32},
	"i386-chroot":                                      {Errnos: []string{"SIGSYS"}, MayNotProbe: noIA32},
	"socket-packet-raw":                                {Errnos: afNoSupport, Exact: true},
	"socket-packet-dgram":                              {Errnos: afNoSupport, Exact: true},
	"socket-inet-sock-packet":                          {Errnos: typeNoSupport, Exact: true},
	"socket-inet-raw":                                  {Errnos: []string{"EPERM"}},
	"socket-inet-raw-icmp":                             {Errnos: []string{"EPERM"}},
	"socket-inet6-raw":                                 {Errnos: []string{"EPERM"}},
	"socket-vsock":                                     {Errnos: afNoSupport, Exact: true},
	"socket-alg":                                       {Errnos: afNoSupport, Exact: true},
	"socket-key":                                       {Errnos: afNoSupport, Exact: true},
	"socket-bluetooth":                                 {Errnos: afNoSupport, Exact: true},
	"socket-can":                                       {Errnos: afNoSupport, Exact: true},
	"socket-tipc":                                      {Errnos: afNoSupport, Exact: true},
	"socket-rds":                                       {Errnos: afNoSupport, Exact: true},
	"socket-xdp":                                       {Errnos: afNoSupport, Exact: true},
	"socket-inet-ping":                                 {Errnos: []string{"EACCES"}},
	"socket-inet6-ping":                                {Errnos: []string{"EACCES"}},
	"socket-inet-mptcp":                                {Errnos: protoNoSupport, Exact: true},
	"socket-inet6-mptcp":                               {Errnos: protoNoSupport, Exact: true},
	"socket-inet-mptcp-upper":                          {Errnos: protoNoSupport, Exact: true},
	"socket-inet-udplite":                              {Errnos: protoNoSupport, Exact: true},
	"socket-inet6-udplite":                             {Errnos: protoNoSupport, Exact: true},
	"socket-inet-sctp":                                 {Errnos: protoNoSupport, Exact: true},
	"socket-inet-sctp-seqpacket":                       {Errnos: typeNoSupport, Exact: true},
	"socket-inet6-sctp-seqpacket":                      {Errnos: typeNoSupport, Exact: true},
	"socket-inet-dccp":                                 {Errnos: typeNoSupport, Exact: true},
	"socket-inet6-dccp":                                {Errnos: typeNoSupport, Exact: true},
	"socket-netlink-xfrm":                              {Errnos: protoNoSupport, Exact: true},
	"socket-netlink-netfilter":                         {Errnos: protoNoSupport, Exact: true},
	"socket-netlink-audit":                             {Errnos: protoNoSupport, Exact: true},
	"socket-netlink-generic":                           {Errnos: protoNoSupport, Exact: true},
	"socket-netlink-uevent":                            {Errnos: protoNoSupport, Exact: true},
	"socket-netlink-xfrm-upper":                        {Errnos: protoNoSupport, Exact: true},
	"socket-rxrpc":                                     {Errnos: afNoSupport, Exact: true},
	"socket-kcm":                                       {Errnos: afNoSupport, Exact: true},
	"socket-family-max":                                {Errnos: afNoSupport, Exact: true},
	"socket-family-200":                                {Errnos: afNoSupport, Exact: true},
	"socket-alg-upper":                                 {Errnos: afNoSupport, Exact: true},
	"socketpair-inet":                                  {Errnos: afNoSupport, Exact: true},
	"setsockopt-tcp-ulp":                               {Errnos: []string{"EPERM"}, Exact: true},
	"setsockopt-tcp-ulp-upper":                         {Errnos: []string{"EPERM"}, Exact: true},
	"ioctl-tiocsti":                                    {Errnos: []string{"EPERM"}, Exact: true},
	"ioctl-tiocsti-upper":                              {Errnos: []string{"EPERM"}, Exact: true},
	"ioctl-tioclinux":                                  {Errnos: []string{"EPERM"}, Exact: true},
	"ioctl-tioclinux-upper":                            {Errnos: []string{"EPERM"}, Exact: true},
	"ioctl-tiocsetd":                                   {Errnos: []string{"EPERM"}, Exact: true},
	"ioctl-tiocsetd-upper":                             {Errnos: []string{"EPERM"}, Exact: true},
	"fork-pids-limit":                                  {Errnos: []string{"EAGAIN"}},
	"rlimit-nofile-emfile":                             {Errnos: []string{"EMFILE"}},
	"rlimit-nofile-raise":                              {Errnos: []string{"EPERM"}},
	"rlimit-core-zero":                                 {Errnos: []string{"EPERM"}},
	"tcp-1.1.1.1-443":                                  {Errnos: []string{"ENETUNREACH"}},
	"tcp-10.0.0.1-80":                                  {Errnos: []string{"ENETUNREACH"}},
	"tcp-192.168.0.1-80":                               {Errnos: []string{"ENETUNREACH"}},
	"tcp-fd00::1-80":                                   {Errnos: []string{"ENETUNREACH"}},
	"tcp-2606:4700:4700::1111-443":                     {Errnos: []string{"ENETUNREACH"}},
	"udp-8.8.8.8-53":                                   {Errnos: []string{"ENETUNREACH"}},
	"udp-2001:4860:4860::8888-53":                      {Errnos: []string{"ENETUNREACH"}},
	"netns-only-lo":                                    {},
	"tcp-loopback-hostport":                            {Errnos: []string{"ECONNREFUSED"}},
	"abstract-unix-host":                               {Errnos: []string{"ECONNREFUSED"}},
	"tcp-metadata-169.254.169.254":                     {Errnos: []string{"ENETUNREACH"}},
	"tcp-metadata-fd00:ec2::254":                       {Errnos: []string{"ENETUNREACH"}},
	"tcp-metadata-100.100.100.200":                     {Errnos: []string{"ENETUNREACH"}},
}

// withAllowlist is table t for a run with a network allowlist: its
// namespace holds eth0 and the route to its gateway besides lo. The direct
// egress probes (public, private, metadata and host addresses, the host's
// abstract socket) still must fail: only the gateway is reachable.
func withAllowlist(t map[string]expectation) map[string]expectation {
	t = maps.Clone(t)
	e := t["netns-only-lo"]
	e.Info = true
	t["netns-only-lo"] = e
	return t
}

// runsc is the libcontainer table adjusted for gVisor as far as it is known
// before runsc is wired in: the Sentry answers ENOSYS for what it does not
// implement, and it has only the 64-bit syscall ABI. Whoever adds runsc
// confirms or corrects this table from a first run's report.
func runsc() map[string]expectation {
	t := maps.Clone(libcontainer)
	for id, e := range t {
		switch {
		case strings.HasPrefix(id, "clone3"):
			// ENOSYS there too: a trace rule (runsc.SpecOpt).
		case e.Exact:
			// The kernel surface's refusals are errno rules of the
			// filter, which gVisor answers with EPERM
			// (runsc.TestSeccompErrno).
			if !slices.Contains(e.Errnos, "EPERM") {
				e.Errnos = append(slices.Clone(e.Errnos), "EPERM")
			}
		case len(e.Errnos) > 0:
			e.Errnos = append(slices.Clone(e.Errnos), "ENOSYS")
		}
		if strings.HasPrefix(id, "i386-") {
			e.MayNotProbe = "gVisor implements only the 64-bit syscall ABI; int 0x80 faults"
		}
		t[id] = e
	}
	// Where gVisor legitimately differs: what the program sees is gVisor's
	// own kernel, not the host's.
	for id, why := range map[string]string{
		"fd-stdio-targets":  "gVisor shows donated host fds as host:[N]",
		"tmp-mount-options": "gVisor's mountinfo omits nodev; it has no host devices to expose",
		"dev-listing":       "gVisor adds its own emulated /dev/fuse and /dev/net/tun (in the sentry, unusable without capabilities), never host devices",
	} {
		e := t[id]
		e.Info = true
		e.MayNotProbe = why
		t[id] = e
	}
	for id, why := range map[string]string{
		"procsys-mount-readonly": "gVisor's /proc/sys is its own emulation, not a read-only bind mount",
		"umount2-masked":         "gVisor masks paths without mounts, so none is a mount point",
		"umount2-proc-sys":       "gVisor's /proc/sys is not a mount point",
		"open-by-handle-at":      "gVisor has no name_to_handle_at (ENOTSUP), so there is no handle to try",
		"netns-only-lo":          "gVisor has no /sys/class/net; the direct egress probes cover its network",
	} {
		e := t[id]
		e.Info = true
		e.MayNotProbe = why
		t[id] = e
	}
	return t
}
