/* SPDX-License-Identifier: Apache-2.0 */
/*
 * uringraw: a program that sets up io_uring itself, through glibc's
 * syscall() (as Rust's io-uring crate does), with no liburing for the shim
 * to see, and then pages. The kernel pins the buffers of such a program's
 * O_DIRECT I/O after its submitting calls return, so its pager must serve
 * faults with handler threads and keep pinned pages (uffd/preload.c). Its
 * memory is then written and rewritten at random over a budget smaller than
 * it, and every page checked.
 *
 *   uringraw [MiB [late] [heap] [registered]]   (prints "uringraw: ok", or what went wrong)
 *
 * late: io_uring is set up after the memory was first written, when the
 * pager runs already: it can no longer change where faults are served, but
 * keeps pinned pages from then on. heap: the memory is glibc's heap, blocks
 * of 64 KiB (below malloc's mmap threshold), a page's word at each 4 KiB.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096ul

/* struct io_uring_params: 120 bytes the kernel fills in; none of it is read here. */
struct uring_params {
	uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features, wq_fd, resv[3];
	uint64_t offsets[10];
};

#define BLOCK (64ul << 10)

static uint8_t **blocks; /* heap: the blocks; else NULL, and the memory is one mapping at base */
static uint8_t *base;

static uint64_t *word_at(size_t page)
{
	if (blocks)
		return (uint64_t *)(blocks[page / (BLOCK / PAGE)] + page % (BLOCK / PAGE) * PAGE);
	return (uint64_t *)(base + page * PAGE);
}

static uint64_t word_of(size_t page, unsigned round)
{
	return (uint64_t)page * 0x9E3779B97F4A7C15ull ^ round;
}

/* The pages of the mapping pinned as a fixed buffer and let go again; then how many are resident 2 s on. */
static int pin_and_let_go(long ring, size_t pages)
{
	struct iovec iov = { base, pages * PAGE };
	unsigned char *in = malloc(pages);
	size_t resident = 0;

	if (!in || syscall(SYS_io_uring_register, (int)ring, 0 /* IORING_REGISTER_BUFFERS */, &iov, 1) ||
	    syscall(SYS_io_uring_register, (int)ring, 1 /* IORING_UNREGISTER_BUFFERS */, NULL, 0)) {
		perror("uringraw: registered buffer");
		free(in);
		return -1;
	}
	sleep(2);
	if (mincore(base, pages * PAGE, in)) {
		perror("uringraw: mincore");
		free(in);
		return -1;
	}
	for (size_t p = 0; p < pages; p++)
		resident += in[p] & 1;
	printf("uringraw: %zu of %zu pages resident after the pins\n", resident, pages);
	free(in);
	return 0;
}

static long uring_setup(void)
{
	struct uring_params params;
	long fd;

	memset(&params, 0, sizeof(params));
	fd = syscall(SYS_io_uring_setup, 4, &params);
	if (fd < 0)
		perror("uringraw: io_uring_setup");
	return fd;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64, pages = mib * (1ul << 20) / PAGE;
	int late = 0, heap = 0, registered = 0;
	unsigned *round;
	long ring = -1;

	for (int k = 2; k < argc; k++) {
		late |= !strcmp(argv[k], "late");
		heap |= !strcmp(argv[k], "heap");
		registered |= !strcmp(argv[k], "registered");
	}
	if (registered && heap) {
		fprintf(stderr, "uringraw: registered is for the mapping, not the heap\n");
		return 2;
	}
	if (!late && (ring = uring_setup()) < 0)
		return 3;
	round = calloc(pages, sizeof(*round));
	if (heap) {
		blocks = calloc(pages * PAGE / BLOCK, sizeof(*blocks));
		for (size_t b = 0; blocks && b < pages * PAGE / BLOCK; b++)
			if (!(blocks[b] = malloc(BLOCK)))
				blocks = NULL;
	} else {
		base = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if ((heap ? !blocks : base == MAP_FAILED) || !round) {
		perror("uringraw: memory");
		return 2;
	}
	for (size_t p = 0; p < pages; p++)
		*word_at(p) = word_of(p, 0);
	if (late && (ring = uring_setup()) < 0)
		return 3;
	srand(1);
	for (size_t k = 0; k < 4 * pages; k++) {
		size_t p = (size_t)rand() % pages;
		if (*word_at(p) != word_of(p, round[p])) {
			printf("uringraw: page %zu lost its last write\n", p);
			return 1;
		}
		*word_at(p) = word_of(p, ++round[p]);
	}
	if (registered && pin_and_let_go(ring, pages))
		return 3;
	for (size_t p = 0; p < pages; p++)
		if (*word_at(p) != word_of(p, round[p])) {
			printf("uringraw: page %zu lost its last write\n", p);
			return 1;
		}
	close((int)ring);
	printf("uringraw: ok\n");
	return 0;
}
