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
 *
 * With --handover FD it loads nothing: it is the program's own start in a
 * sandbox prepared ahead (a pooled one), run by the init under the filter
 * this program loaded first. It waits on FD, agentrun's hand-over channel
 * (runtime/backend.Handover), for the run: it says "ready", reads "go",
 * answers "ok", waits for agentrun's close, closes FD and executes its
 * arguments, the program, as the init would have (execvp: a name without
 * a slash is looked up in PATH; a failed exec exits with tini's status). Anything else on the channel, or a process
 * without no_new_privs or a seccomp filter, and it executes nothing.
 */
#include <errno.h>
#include <limits.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* say writes the whole of msg to fd. */
static int say(int fd, const char *msg)
{
	size_t len = strlen(msg);
	while (len > 0) {
		ssize_t n = write(fd, msg, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		msg += n;
		len -= (size_t)n;
	}
	return 0;
}

/* next reads one byte of fd into c: 1, 0 at its end, -1 on an error. */
static int next(int fd, char *c)
{
	ssize_t n;
	do
		n = read(fd, c, 1);
	while (n < 0 && errno == EINTR);
	return (int)n;
}

/*
 * handover waits for the run on fd: 0 once agentrun has handed the
 * sandbox over and fd is closed, -1 otherwise (nothing may run then).
 */
static int handover(int fd)
{
	char line[3];
	size_t n = 0;
	char c;
	if (say(fd, "ready\n") != 0)
		return -1;
	for (;;) {
		if (next(fd, &c) != 1)
			return -1;
		if (c == '\n')
			break;
		if (n == sizeof(line))
			return -1;
		line[n++] = c;
	}
	if (n != 2 || memcmp(line, "go", 2) != 0 || say(fd, "ok\n") != 0)
		return -1;
	/* agentrun's close: nothing more may come before it. */
	if (next(fd, &c) != 0)
		return -1;
	return close(fd);
}

static int start(int argc, char **argv)
{
	char *end;
	errno = 0;
	long fd = argc > 3 ? strtol(argv[2], &end, 10) : -1;
	if (argc < 4 || errno != 0 || end == argv[2] || *end != '\0' || fd <= 2 || fd > INT_MAX) {
		fprintf(stderr, "usage: agentrun-seccomp --handover FD PROGRAM [ARG...]\n");
		return 126;
	}
	if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
		errno = EPERM;
		return fail("no_new_privs is not set");
	}
	if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) != SECCOMP_MODE_FILTER) {
		errno = EPERM;
		return fail("no seccomp filter is loaded");
	}
	if (handover((int)fd) != 0)
		return 1; /* no run: the sandbox is destroyed unused */
	/*
	 * As the init (tini) would have: PATH looked up for a bare name, and
	 * a failed exec's status as tini's, 127 for a program not found, 126
	 * for one not executable, 1 otherwise.
	 */
	execvp(argv[3], argv + 3);
	int status = errno == ENOENT ? 127 : errno == EACCES ? 126 : 1;
	fprintf(stderr, "agentrun-seccomp: exec %s failed: %s\n", argv[3], strerror(errno));
	return status;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--handover") == 0)
		return start(argc, argv);
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
