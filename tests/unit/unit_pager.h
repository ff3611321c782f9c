/* SPDX-License-Identifier: Apache-2.0 */
/* A pager for a unit test: on one memd (or several), with the unit secret. */
#ifndef FARMEM_UNIT_PAGER_H
#define FARMEM_UNIT_PAGER_H

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"

/* The pager's object_end for the pagers made below (pager.h): a test's own layout of objects, or none. */
static uintptr_t (*unit_object_end)(uintptr_t addr, uintptr_t from);
/* Its referents (pager.h): a test's own references, or none. */
static unsigned (*unit_referents)(uintptr_t addr, uintptr_t slot, uintptr_t end, uintptr_t *out, unsigned max);

/*
 * A pager on memd at addr ("unix:PATH", or a list) with a local budget and the
 * settings in more (key, value, ..., NULL); NULL, counted as a failure, if it
 * does not start. what names the case in the failure's message. is_gc_thread
 * and full_gc_in_memd stand for the JVM agent's (NULL: no collector).
 */
static inline struct fm_pager *unit_pager_gc_ex(const char *what, const char *addr, const char *local,
						const char *const *more, int (*is_gc_thread)(pid_t tid),
						int (*full_gc_in_memd)(void))
{
	struct fm_pager_cfg cfg;
	struct fm_pager *p = NULL;
	char err[512];

	fm_pager_cfg_defaults(&cfg);
	CHECK(fm_pager_cfg_set(&cfg, "memd", addr, err, sizeof(err)) == 0);
	CHECK(fm_pager_cfg_set(&cfg, "secret", UNIT_MEMD_SECRET, err, sizeof(err)) == 0);
	CHECK(fm_pager_cfg_set(&cfg, "local", local, err, sizeof(err)) == 0);
	for (; more && more[0]; more += 2)
		CHECK(fm_pager_cfg_set(&cfg, more[0], more[1], err, sizeof(err)) == 0);
	cfg.is_gc_thread = is_gc_thread;
	cfg.full_gc_in_memd = full_gc_in_memd;
	cfg.object_end = unit_object_end;
	cfg.referents = unit_referents;
	if (fm_pager_start(&cfg, &p, err, sizeof(err))) {
		fprintf(stderr, "fm_pager_start (%s): %s\n", what, err);
		failures++;
		return NULL;
	}
	return p;
}

/* The same with no full GC ever under way. */
static inline struct fm_pager *unit_pager_gc(const char *what, const char *addr, const char *local,
					     const char *const *more, int (*is_gc_thread)(pid_t tid))
{
	return unit_pager_gc_ex(what, addr, local, more, is_gc_thread, NULL);
}

static inline struct fm_pager *unit_pager(const char *what, const char *addr, const char *local,
					  const char *const *more)
{
	return unit_pager_gc(what, addr, local, more, NULL);
}

/* The same on the test's memd at sock, the case named by its fault mode. */
static inline struct fm_pager *unit_pager_at(const char *sock, const char *fault, const char *local,
					     const char *const *more)
{
	char addr[128], what[64];

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	snprintf(what, sizeof(what), "fault=%s", fault);
	return unit_pager(what, addr, local, more);
}

/* The state byte of page i of the first region in the residency map h. */
static inline uint8_t *unit_state_byte(struct fm_resmap_hdr *h, uint64_t i)
{
	return (uint8_t *)h + h->regions[0].map_offset + i;
}

/* len bytes of fresh anonymous memory, registered with p (flags: FM_REG_*); NULL, counted, if not. */
static inline uint8_t *unit_region(struct fm_pager *p, size_t len, uint32_t flags)
{
	uint8_t *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(a != MAP_FAILED);
	if (a == MAP_FAILED)
		return NULL;
	CHECK(fm_pager_register(p, a, len, flags) == 0);
	return a;
}

/* The same with every page written (write_page, v): what is past the budget is in memd. */
static inline uint8_t *unit_region_written(struct fm_pager *p, size_t len, uint32_t v)
{
	uint8_t *a = unit_region(p, len, 0);

	for (uint64_t i = 0; a && i < len / 4096; i++)
		write_page(a, i, v);
	return a;
}

/* A case's end: nothing read back wrong (bad), no checksum failed, the region let go and unmapped. */
static inline void unit_region_end(struct fm_pager *p, uint8_t *a, size_t len, uint64_t bad)
{
	const struct fm_resmap_hdr *h = fm_pager_map(p);

	CHECK(bad == 0);
	CHECK(h->stats.crc_errors == 0);
	CHECK(fm_pager_unregister(p, a, len) == 0);
	munmap(a, len);
}

/* The tid of the thread named name, or 0. */
static inline long unit_thread_named(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	long tid = 0;

	if (!d)
		return 0;
	while (!tid && (e = readdir(d))) {
		char path[300], comm[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && strncmp(comm, name, strlen(name)) == 0 && comm[strlen(name)] == '\n')
			tid = strtol(e->d_name, NULL, 10);
		fclose(f);
	}
	closedir(d);
	return tid;
}

/* The same, for a thread that should exist: it names itself once running, so wait up to ms for it. */
static inline long unit_thread_started(const char *name, unsigned ms)
{
	long tid;

	while (!(tid = unit_thread_named(name)) && ms--)
		usleep(1000);
	return tid;
}

#endif
