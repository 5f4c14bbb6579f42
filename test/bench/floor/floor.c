/*
 * floor: the kernel's floor of an agentrun sandbox, for the bench
 * (test/bench, "kernel floor (C, no runtime)"). It does, per run, only the
 * system calls the isolation of agentrun's spec (runtime/spec.Default and
 * runner.SandboxSpec) needs, with no container runtime:
 *
 *   parent: the run's cgroup (v1: memory, pids and cpu hierarchies; v2: one
 *           directory) with agentrun's limits; clone(2) into new mount, pid,
 *           net, ipc and uts namespaces; the child moved into the cgroup;
 *           wait; the cgroup removed.
 *   child:  a cgroup namespace (after the move, as runc does); hostname;
 *           mounts private; the rootfs bound, then proc, /dev (tmpfs with
 *           mknod'ed devices), /dev/pts, /dev/shm, /dev/mqueue, /sys, /tmp
 *           and /workspace tmpfs; pivot_root; masked and read-only paths;
 *           the root read-only; lo up; the spec's sysctls, rlimits and
 *           oom_score_adj; no_new_privs, every capability dropped, uid and
 *           gid 65534; agentrun's native-ABI filter (first, as its init
 *           does) and its compiled seccomp filter; exec.
 *
 * What it leaves out is agentrun's and libcontainer's own work: state,
 * locks, the init (tini), the per-run uid, the identity files, the devices
 * cgroup and the other v1 hierarchies, the audit record.
 *
 * Usage: floor -r ROOTFS -s PROGRAM -m MEMORY -w MEMORY+SWAP -p PIDS
 *              -q CPU_QUOTA -P CPU_PERIOD -t TMP_SIZE -W WORKSPACE_SIZE
 *              -f FSIZE -- ARGV...
 *
 * PROGRAM is a seccomp program as agentrun keeps it (state_dir/seccomp):
 * the magic "ARSC", the seccomp(2) flags (both 32-bit little-endian) and
 * the instructions (runtime/runc/seccompexec).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/capability.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#define MAGIC 0x43535241u /* "ARSC" */
#define SANDBOX_ID 65534
#define CGROUP_ROOT "/sys/fs/cgroup"

static struct {
	uint32_t magic;
	uint32_t flags;
	struct sock_filter insns[BPF_MAXINSNS + 1];
} program;
static unsigned short program_len;

static struct {
	const char *rootfs, *seccomp;
	long long memory, memsw, pids, quota, period, tmp, workspace, fsize;
} opt = {.memory = -1, .memsw = -1, .pids = -1, .quota = -1, .period = -1, .tmp = -1, .workspace = -1, .fsize = -1};

/* The v1 hierarchies agentrun's limits are in; v2 has one directory. */
static const char *const v1_controllers[] = {"memory", "pids", "cpu"};
static char cgroups[3][256];
static int ncgroups;

/* in_parent is cleared in the sandbox, so that only the parent removes the
 * cgroup when it exits on an error. */
static int in_parent = 1;
/* sandbox is the child until it is reaped. */
static pid_t sandbox;
static void remove_cgroup(void);
static void cleanup(void)
{
	if (!in_parent)
		return;
	if (sandbox > 0) {
		kill(sandbox, SIGKILL);
		waitpid(sandbox, NULL, 0);
	}
	remove_cgroup();
}

static void die(const char *what, const char *arg)
{
	fprintf(stderr, "floor: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "", strerror(errno));
	exit(126);
}

/* runtime/spec.MaskedPaths and ReadonlyPaths. */
static const char *const masked[] = {
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/sched_debug", "/proc/scsi", "/proc/timer_list",
	"/proc/timer_stats", "/sys/devices/virtual/powercap", "/sys/firmware",
};
static const char *const readonly[] = {
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
};

/* The devices of a runc sandbox's /dev (libcontainer's AllowedDevices). */
static const struct {
	const char *name;
	unsigned major, minor;
} devices[] = {
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
};

static const struct {
	const char *target, *name;
} dev_links[] = {
	{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
	{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"},
};

static void write_file(const char *path, const char *value, int optional)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 && optional && errno == ENOENT)
		return;
	if (fd < 0)
		die("opening", path);
	ssize_t n = write(fd, value, strlen(value));
	if (n != (ssize_t)strlen(value))
		die("writing", path);
	if (close(fd) != 0)
		die("closing", path);
}

static void write_limit(const char *dir, const char *file, long long v, int optional)
{
	char path[512], value[64];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	snprintf(value, sizeof(value), "%lld", v);
	write_file(path, value, optional);
}

/* read_program reads the seccomp program at path into program. */
static void read_program(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("opening the seccomp program", path);
	ssize_t n = read(fd, &program, sizeof(program));
	if (n < 0)
		die("reading the seccomp program", path);
	close(fd);
	size_t body = (size_t)n - 8;
	if (n < 8 + (ssize_t)sizeof(struct sock_filter) || program.magic != MAGIC ||
	    body % sizeof(struct sock_filter) != 0 || body / sizeof(struct sock_filter) > BPF_MAXINSNS) {
		errno = EINVAL;
		die("malformed seccomp program", path);
	}
	program_len = (unsigned short)(body / sizeof(struct sock_filter));
}

/* make_cgroup creates the run's cgroup and writes agentrun's limits. */
static void make_cgroup(void)
{
	struct statfs fs;
	if (statfs(CGROUP_ROOT, &fs) != 0)
		die("statfs", CGROUP_ROOT);
	char name[64];
	snprintf(name, sizeof(name), "agentrun-floor-%d", getpid());
	if (fs.f_type == CGROUP2_SUPER_MAGIC) {
		snprintf(cgroups[0], sizeof(cgroups[0]), CGROUP_ROOT "/%s", name);
		ncgroups = 1;
		if (mkdir(cgroups[0], 0755) != 0)
			die("creating the cgroup", cgroups[0]);
		write_limit(cgroups[0], "memory.max", opt.memory, 0);
		write_limit(cgroups[0], "memory.swap.max", opt.memsw - opt.memory, 1);
		write_limit(cgroups[0], "pids.max", opt.pids, 0);
		char cpu[64], path[512];
		snprintf(cpu, sizeof(cpu), "%lld %lld", opt.quota, opt.period);
		snprintf(path, sizeof(path), "%s/cpu.max", cgroups[0]);
		write_file(path, cpu, 0);
		return;
	}
	for (size_t i = 0; i < sizeof(v1_controllers) / sizeof(v1_controllers[0]); i++) {
		snprintf(cgroups[i], sizeof(cgroups[i]), CGROUP_ROOT "/%s/%s", v1_controllers[i], name);
		if (mkdir(cgroups[i], 0755) != 0)
			die("creating the cgroup", cgroups[i]);
		ncgroups = i + 1;
	}
	write_limit(cgroups[0], "memory.limit_in_bytes", opt.memory, 0);
	write_limit(cgroups[0], "memory.memsw.limit_in_bytes", opt.memsw, 1);
	write_limit(cgroups[0], "memory.kmem.tcp.limit_in_bytes", opt.memory, 1);
	write_limit(cgroups[1], "pids.max", opt.pids, 0);
	write_limit(cgroups[2], "cpu.cfs_period_us", opt.period, 0);
	write_limit(cgroups[2], "cpu.cfs_quota_us", opt.quota, 0);
}

static void join_cgroup(pid_t pid)
{
	for (int i = 0; i < ncgroups; i++)
		write_limit(cgroups[i], "cgroup.procs", pid, 0);
}

/* remove_cgroup removes the run's cgroup, waiting for the kernel to let
 * go of a directory whose last task has just been reaped. */
static void remove_cgroup(void)
{
	for (int i = 0; i < ncgroups; i++) {
		for (int try = 0; rmdir(cgroups[i]) != 0; try++) {
			if (errno == ENOENT)
				break;
			if (errno != EBUSY || try == 1000) {
				fprintf(stderr, "floor: removing the cgroup %s: %s\n", cgroups[i], strerror(errno));
				_exit(126);
			}
			usleep(1000);
		}
	}
	ncgroups = 0;
}

static void do_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data)
{
	if (mount(src, dst, type, flags, data) != 0)
		die("mounting", dst);
}

static void make_dir(const char *path)
{
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		die("mkdir", path);
}

/* mount_root binds the rootfs and mounts the spec's mounts in it, as
 * libcontainer does before pivot_root. */
static void mount_root(void)
{
	char data[128];
	do_mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
	do_mount(opt.rootfs, opt.rootfs, NULL, MS_BIND | MS_REC, NULL);
	if (chdir(opt.rootfs) != 0)
		die("chdir", opt.rootfs);
	do_mount("proc", "proc", "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL);
	do_mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_STRICTATIME, "mode=755,size=64k");
	make_dir("dev/pts");
	do_mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
	make_dir("dev/shm");
	snprintf(data, sizeof(data), "mode=1777,size=%lld", opt.tmp);
	do_mount("shm", "dev/shm", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, data);
	make_dir("dev/mqueue");
	do_mount("mqueue", "dev/mqueue", "mqueue", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL);
	do_mount("sysfs", "sys", "sysfs", MS_NOSUID | MS_NOEXEC | MS_NODEV | MS_RDONLY, NULL);
	do_mount("tmpfs", "tmp", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, data);
	snprintf(data, sizeof(data), "mode=755,uid=%d,gid=%d,size=%lld", SANDBOX_ID, SANDBOX_ID, opt.workspace);
	do_mount("tmpfs", "workspace", "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, data);
	mode_t old = umask(0);
	for (size_t i = 0; i < sizeof(devices) / sizeof(devices[0]); i++) {
		char path[64];
		snprintf(path, sizeof(path), "dev/%s", devices[i].name);
		if (mknod(path, S_IFCHR | 0666, makedev(devices[i].major, devices[i].minor)) != 0)
			die("mknod", path);
	}
	umask(old);
	for (size_t i = 0; i < sizeof(dev_links) / sizeof(dev_links[0]); i++) {
		char path[64];
		snprintf(path, sizeof(path), "dev/%s", dev_links[i].name);
		if (symlink(dev_links[i].target, path) != 0)
			die("symlink", path);
	}
}

/* pivot makes the bound rootfs the root and lets go of the old one. */
static void pivot(void)
{
	if (syscall(SYS_pivot_root, ".", ".") != 0)
		die("pivot_root", opt.rootfs);
	if (umount2(".", MNT_DETACH) != 0)
		die("unmounting the old root", NULL);
	if (chdir("/") != 0)
		die("chdir", "/");
}

/* The spec's sysctls (runtime/spec.SocketBuffer), in the new netns. */
static void sysctls(void)
{
	write_file("/proc/sys/net/ipv4/tcp_rmem", "4096 65536 262144", 0);
	write_file("/proc/sys/net/ipv4/tcp_wmem", "4096 16384 262144", 0);
}

/* mask_paths hides the masked paths and makes the read-only ones so, as
 * libcontainer does: /dev/null over a file, an empty read-only tmpfs over
 * a directory, a read-only bind over each read-only path. */
static void mask_paths(void)
{
	for (size_t i = 0; i < sizeof(masked) / sizeof(masked[0]); i++) {
		struct stat st;
		if (stat(masked[i], &st) != 0) {
			if (errno == ENOENT)
				continue;
			die("stat", masked[i]);
		}
		if (S_ISDIR(st.st_mode))
			do_mount("tmpfs", masked[i], "tmpfs", MS_RDONLY, NULL);
		else
			do_mount("/dev/null", masked[i], NULL, MS_BIND, NULL);
	}
	for (size_t i = 0; i < sizeof(readonly) / sizeof(readonly[0]); i++) {
		if (mount(readonly[i], readonly[i], NULL, MS_BIND | MS_REC, NULL) != 0) {
			if (errno == ENOENT)
				continue;
			die("binding", readonly[i]);
		}
		do_mount(readonly[i], readonly[i], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	}
	do_mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL);
}

/* loopback_up brings up lo, the new netns's only link (as libcontainer's
 * loopback network does). */
static void loopback_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		die("socket", NULL);
	struct ifreq ifr = {0};
	strcpy(ifr.ifr_name, "lo");
	ifr.ifr_flags = IFF_UP | IFF_RUNNING;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
		die("bringing up", "lo");
	close(s);
}

static void set_rlimit(int resource, rlim_t v)
{
	struct rlimit r = {v, v};
	if (setrlimit(resource, &r) != 0)
		die("setrlimit", NULL);
}

/* drop_privileges: no_new_privs, an empty bounding and ambient set, uid
 * and gid 65534 with no supplementary groups, no capabilities left. */
static void drop_privileges(void)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		die("no_new_privs", NULL);
	for (int cap = 0; prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0; cap++)
		;
	if (errno != EINVAL)
		die("dropping the bounding set", NULL);
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
		die("clearing the ambient set", NULL);
	if (setgroups(0, NULL) != 0)
		die("setgroups", NULL);
	if (setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID) != 0)
		die("setgid", NULL);
	if (setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID) != 0)
		die("setuid", NULL);
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[2] = {{0}};
	if (syscall(SYS_capset, &hdr, data) != 0)
		die("capset", NULL);
}

/* native_abi_filter kills the process on a system call through any ABI
 * but x86-64's (runtime/runc/abi.go): agentrun installs it first in every
 * container's init. */
static void native_abi_filter(void)
{
#ifdef __x86_64__
	static struct sock_filter insns[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),
		BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x40000000, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
	};
	struct sock_fprog prog = {.len = sizeof(insns) / sizeof(insns[0]), .filter = insns};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
		die("loading the native-ABI filter", NULL);
#endif
}

/* load_seccomp loads agentrun's compiled filter, as agentrun-seccomp does. */
static void load_seccomp(void)
{
	struct sock_fprog prog = {.len = program_len, .filter = program.insns};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, program.flags, &prog) != 0)
		die("loading the seccomp filter", NULL);
}

/* child is the sandbox: it waits until the parent has moved it into the
 * run's cgroup, sets itself up and executes argv. */
static void child(int sync_fd, char **argv)
{
	char c;
	if (read(sync_fd, &c, 1) != 1)
		die("waiting for the cgroup", NULL);
	close(sync_fd);
	native_abi_filter();
	if (unshare(CLONE_NEWCGROUP) != 0)
		die("unshare", "cgroup");
	if (sethostname("sandbox", 7) != 0)
		die("sethostname", NULL);
	mount_root();
	pivot();
	sysctls();
	mask_paths();
	loopback_up();
	write_file("/proc/self/oom_score_adj", "1000", 0);
	set_rlimit(RLIMIT_NOFILE, 1024);
	set_rlimit(RLIMIT_CORE, 0);
	set_rlimit(RLIMIT_FSIZE, (rlim_t)opt.fsize);
	if (chdir("/workspace") != 0)
		die("chdir", "/workspace");
	drop_privileges();
	load_seccomp();
	char *env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", NULL};
	environ = env;
	execvp(argv[0], argv);
	die("exec", argv[0]);
}

static long long number(const char *flag, const char *s)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno != 0 || *s == '\0' || *end != '\0' || v <= 0) {
		fprintf(stderr, "floor: %s \"%s\": not a positive number\n", flag, s);
		exit(2);
	}
	return v;
}

static void usage(void)
{
	fprintf(stderr, "usage: floor -r ROOTFS -s SECCOMP_PROGRAM -m MEMORY -w MEMORY+SWAP -p PIDS -q CPU_QUOTA -P CPU_PERIOD -t TMP_SIZE -W WORKSPACE_SIZE -f FSIZE -- ARGV...\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int c;
	while ((c = getopt(argc, argv, "+r:s:m:w:p:q:P:t:W:f:")) != -1) {
		char flag[] = {'-', (char)c, 0};
		switch (c) {
		case 'r': opt.rootfs = optarg; break;
		case 's': opt.seccomp = optarg; break;
		case 'm': opt.memory = number(flag, optarg); break;
		case 'w': opt.memsw = number(flag, optarg); break;
		case 'p': opt.pids = number(flag, optarg); break;
		case 'q': opt.quota = number(flag, optarg); break;
		case 'P': opt.period = number(flag, optarg); break;
		case 't': opt.tmp = number(flag, optarg); break;
		case 'W': opt.workspace = number(flag, optarg); break;
		case 'f': opt.fsize = number(flag, optarg); break;
		default: usage();
		}
	}
	if (optind >= argc || !opt.rootfs || !opt.seccomp || opt.memory < 0 || opt.memsw < 0 || opt.pids < 0 ||
	    opt.quota < 0 || opt.period < 0 || opt.tmp < 0 || opt.workspace < 0 || opt.fsize < 0)
		usage();
	read_program(opt.seccomp);
	atexit(cleanup);
	make_cgroup();
	int sync[2];
	if (pipe2(sync, O_CLOEXEC) != 0)
		die("pipe", NULL);
	pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD, NULL, NULL, NULL, 0);
	if (pid < 0)
		die("clone", NULL);
	if (pid == 0) {
		in_parent = 0;
		close(sync[1]);
		child(sync[0], argv + optind);
	}
	sandbox = pid;
	close(sync[0]);
	join_cgroup(pid);
	if (write(sync[1], "", 1) != 1)
		die("starting the sandbox", NULL);
	close(sync[1]);
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			die("waitpid", NULL);
	sandbox = 0;
	remove_cgroup();
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}
