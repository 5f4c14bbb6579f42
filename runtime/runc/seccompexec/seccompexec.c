/*
 * agentrun-seccomp: the first program of a libcontainer sandbox. It loads
 * the sandbox's seccomp filter, compiled once by agentrun and passed on
 * fd 3, then executes its arguments (the sandbox's init) in its place.
 *
 * libcontainer compiles the filter from its rules in every container's
 * init; agentrun compiles it once per process (runtime/runc/seccomp.go)
 * and gives libcontainer no rules. This program runs as the sandbox's
 * user, without capabilities, with no_new_privs set; it loads the filter
 * before anything of the task runs and never executes anything when it
 * cannot. It is static so that it runs in any image.
 *
 * fd 3 holds a header (the magic "ARSC", then the seccomp(2) flags, both
 * 32-bit little-endian) and the filter's instructions (struct sock_filter).
 * It is read with pread, so that every sandbox may share one descriptor.
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PROGRAM_FD 3
#define MAGIC 0x43535241u /* "ARSC" */

static struct {
	uint32_t magic;
	uint32_t flags;
	struct sock_filter insns[BPF_MAXINSNS + 1];
} program;

static int fail(const char *what)
{
	fprintf(stderr, "agentrun-seccomp: %s: %s\n", what, strerror(errno));
	return 126;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: agentrun-seccomp PROGRAM [ARG...] (the filter on fd %d)\n", PROGRAM_FD);
		return 126;
	}
	ssize_t n = pread(PROGRAM_FD, &program, sizeof(program), 0);
	if (n < 0)
		return fail("reading the filter");
	size_t body = (size_t)n - 8;
	if (n < 8 + (ssize_t)sizeof(struct sock_filter) || program.magic != MAGIC ||
	    body % sizeof(struct sock_filter) != 0 || body / sizeof(struct sock_filter) > BPF_MAXINSNS) {
		errno = EINVAL;
		return fail("the filter on fd 3 is malformed");
	}
	if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
		errno = EPERM;
		return fail("no_new_privs is not set");
	}
	struct sock_fprog prog = {
		.len = (unsigned short)(body / sizeof(struct sock_filter)),
		.filter = program.insns,
	};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, program.flags, &prog) != 0)
		return fail("loading the filter");
	if (close(PROGRAM_FD) != 0)
		return fail("closing the filter");
	execv(argv[1], argv + 1);
	return fail(argv[1]);
}
