// SPDX-License-Identifier: Apache-2.0
/*
 * A library of ownalloc's whose constructor allocates a big block before the
 * preload shim's constructor has run (a program's libraries are initialised
 * before the preloaded shim: rustc's libLLVM starts jemalloc so). The block
 * comes from the executable's allocator; early_check() reads it back.
 * early_map() maps memory for that allocator from this library's code, which
 * the shim cannot tell for the allocator's (ownalloc --foreign-mmap).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "../mix.h"

#define EARLY_WORDS ((3u << 20) / sizeof(uint64_t))

static uint64_t *early;

__attribute__((constructor)) static void early_init(void)
{
	early = malloc(EARLY_WORDS * sizeof(uint64_t));
	if (!early)
		abort();
	for (size_t i = 0; i < EARLY_WORDS; i++)
		early[i] = mix(i ^ 0xea71);
}

/* The words that are not what the constructor wrote. */
size_t early_check(void)
{
	size_t bad = 0;

	for (size_t i = 0; i < EARLY_WORDS; i++)
		bad += early[i] != mix(i ^ 0xea71);
	return bad;
}

/* n bytes mapped by this library: MAP_FAILED as mmap. */
void *early_map(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	/* Not a tail call: mmap's return address must lie in this library, not in its caller. */
	__asm__ volatile("" : : "r"(p) : "memory");
	return p;
}
