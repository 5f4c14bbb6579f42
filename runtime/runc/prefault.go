package runc

// A cold run executes agentrun twice (the CLI, then the same binary as its
// container's init), and each start touches pages of the binary's code
// and read-only data all over its 24 MB: the Go runtime's start, every
// package's init, libcontainer's. Each first touch was a page fault, one
// for every 16 pages around it at most (the kernel's fault-around), about
// 25 µs each on a VM; prefault maps the binary's read-only segments with
// one madvise(MADV_POPULATE_READ) each instead, from the page cache, before
// the Go runtime starts (a C constructor, as libcontainer's nsexec is). In
// a container's init it runs in nsexec's last child, the init itself
// (named runc:[2:INIT] by then): nsexec's earlier stages fork it, and a
// fork does not copy a file mapping's page tables. A kernel before 5.14,
// which has no MADV_POPULATE_READ, answers EINVAL, and the pages fault in
// as before. See docs/bench.md, "A cold run's wall time".

/*
#define _GNU_SOURCE
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

// agentrun_populate maps the executable's read-only loadable segments
// (dl_iterate_phdr names the executable first, and only it with "").
static int agentrun_populate(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	(void)data;
	if (info->dlpi_name != NULL && info->dlpi_name[0] != '\0')
		return 1;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || (ph->p_flags & PF_W))
			continue;
		unsigned long start = (info->dlpi_addr + ph->p_vaddr) & ~4095UL;
		unsigned long end = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz + 4095) & ~4095UL;
		madvise((void *)start, end - start, MADV_POPULATE_READ);
	}
	return 1;
}

__attribute__((constructor)) static void agentrun_prefault(void) {
	// In a container's init only once nsexec is done: its first stages
	// fork the init, which would fault in every page again.
	if (getenv("_LIBCONTAINER_INITPIPE") != NULL) {
		char name[17] = {0};
		if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0 || strcmp(name, "runc:[2:INIT]") != 0)
			return;
	}
	dl_iterate_phdr(agentrun_populate, NULL);
}
*/
import "C"
