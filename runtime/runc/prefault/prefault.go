// Package prefault maps agentrun's code before the Go runtime starts, in
// every process of the binary: the CLI, serve and each container's init.
//
// A cold run executes agentrun twice (the CLI, then the same binary as its
// container's init), and each start touches pages of the binary's code
// and read-only data all over its 24 MB: the Go runtime's start, every
// package's init, libcontainer's. Each first touch was a page fault, one
// for every 16 pages around it at most (the kernel's fault-around), about
// 25 µs each on a VM; a C constructor maps the binary's read-only segments
// with one madvise(MADV_POPULATE_READ) each instead, from the page cache.
// A kernel before 5.14, which has no MADV_POPULATE_READ, answers EINVAL,
// and the pages fault in as before. See docs/bench.md, "A cold run's wall
// time".
//
// In a container's init it must run in nsexec's last child, the init
// itself (named runc:[2:INIT] by then): nsexec's earlier stages fork it,
// and a fork does not copy a file mapping's page tables. nsexec is
// libcontainer's own constructor, and constructors run in link order,
// which is the order in which the linker first meets their packages,
// breadth first from main: main imports libcontainer's nsenter itself,
// and only runtime/runc imports this package, so nsexec's constructor
// runs first (TestInitConstructorOrder in test/integration holds it).
//
// A wrapped mmap (-Wl,--wrap=mmap) populates the fresh memory the Go
// runtime maps and writes at once: a first write to an anonymous page is
// a fault too, 10 to 13 µs each on this kind of VM against about 1 µs a
// page populated (a C program, 1024 pages each way), and a cold run's CLI
// wrote about 800 such pages. Not in a container's init, whose memory is
// the sandbox's.
//
// The constructor also caps glibc's malloc at one arena: the Go runtime
// starts each thread through cgo, whose thread entry frees its start
// record, and glibc's first free in a thread made that thread an arena of
// its own (64 MB reserved, its first pages faulted in), for the few
// allocations agentrun's C code (libseccomp's compiler) makes.
package prefault

/*
#cgo LDFLAGS: -Wl,--wrap=mmap

#define _GNU_SOURCE
#include <link.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// agentrun_heap_budget is what is left of the bytes of large fixed
// mappings (the Go heap's, 4 MB at a time) that __wrap_mmap populates.
static size_t agentrun_heap_budget = 8 << 20;

void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);


// __wrap_mmap is mmap for the Go runtime (-Wl,--wrap=mmap: with cgo
// linked, the runtime maps all its memory through libc's mmap). It
// populates the fresh anonymous read-write memory the runtime will write
// soon: whole mappings of up to 256 KiB (the runtime's persistent
// allocator's chunks, where its span sets go, and its metadata pages), and
// the first 8 MB of heap (a cold run's CLI uses 5 to 8). Thread stacks
// and reservations are left alone.
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
	void *p = __real_mmap(addr, len, prot, flags, fd, off);
	if (p == MAP_FAILED || !(flags & MAP_ANONYMOUS) || (flags & MAP_STACK) || prot != (PROT_READ | PROT_WRITE))
		return p;
	size_t n = 0;
	if (len <= 256 << 10)
		n = len;
	else if ((flags & MAP_FIXED) && len >= 1 << 20) {
		size_t left = __atomic_exchange_n(&agentrun_heap_budget, 0, __ATOMIC_RELAXED);
		n = len < left ? len : left;
		if (left > n)
			__atomic_add_fetch(&agentrun_heap_budget, left - n, __ATOMIC_RELAXED);
	}
	if (n > 0)
		madvise(p, n, MADV_POPULATE_WRITE);
	return p;
}

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
	mallopt(M_ARENA_MAX, 1);
	if (getenv("_LIBCONTAINER_INITPIPE") != NULL) {
		// A container's init is charged to the sandbox's memory cgroup
		// (its memory_peak_bytes, the 8 MB floor): no heap populated
		// ahead there, only the runtime's small chunks.
		agentrun_heap_budget = 0;
		// The code only once nsexec is done: its first stages fork the
		// init, which would fault in every page again.
		char name[17] = {0};
		if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0 || strcmp(name, "runc:[2:INIT]") != 0)
			return;
	}
	dl_iterate_phdr(agentrun_populate, NULL);
}
*/
import "C"
