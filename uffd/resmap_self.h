/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A paged program's own residency map (resmap.h), for programs that read
 * their own counters around what they measure (bench/progs/faultlat.c,
 * tests/progs/spawntest.c): the pager keeps it in a memfd named farmem-map
 * among the process's file descriptors. Header only: these programs link
 * nothing of farmem's.
 */
#ifndef FARMEM_RESMAP_SELF_H
#define FARMEM_RESMAP_SELF_H

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "resmap.h"

/*
 * This process's map (header and statistics, read-only), or NULL when it has
 * none yet: the pager starts at the first big mapping, so look after one.
 */
static inline const struct fm_resmap_hdr *fm_resmap_self(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	const struct fm_resmap_hdr *found = NULL;
	char path[300], link[256]; /* d_name is up to 255 bytes */

	if (!d)
		return NULL;
	while (!found && (e = readdir(d))) {
		ssize_t n;
		void *m;
		int fd;

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strncmp(link, "/memfd:farmem-map", 17))
			continue;
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		m = mmap(NULL, FM_RESMAP_MAP_OFFSET, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (m == MAP_FAILED)
			continue;
		found = m;
		/* A map inherited from a parent names the parent. */
		if (__atomic_load_n(&found->magic, __ATOMIC_ACQUIRE) != FM_RESMAP_MAGIC ||
		    found->pid != (uint64_t)getpid()) {
			munmap(m, FM_RESMAP_MAP_OFFSET);
			found = NULL;
		}
	}
	closedir(d);
	return found;
}

#endif /* FARMEM_RESMAP_SELF_H */
