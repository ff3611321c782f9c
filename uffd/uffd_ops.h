/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pager's only door to userfaultfd: every UFFDIO_* ioctl of the pager is
 * in uffd_ops.c, so the rules the kernel imposes on them (EEXIST, EAGAIN, a
 * short copy) are decided in one place.
 *
 * Install rules (fm_uffd_install): the kernel stops at the first page that is
 * already mapped (EEXIST for the first page, a short copy and EAGAIN for a
 * later one), and refuses with EAGAIN while an unmap or remap of a registered
 * range is under way (an event the pager has not read yet), and with ENOENT
 * once the range is no longer a registered mapping (a JVM that uncommitted
 * part of its heap, replacing the mapping, while a run of pages for it was
 * being fetched). None is an error: such a page holds bytes we did not put
 * there, or nothing at all, so the caller must not book it as installed; it
 * is reported in *skipped and its thread faults again, into whatever is
 * mapped there then. What the caller fetched stays in memd.
 */
#ifndef FARMEM_UFFD_OPS_H
#define FARMEM_UFFD_OPS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "uffd_compat.h"

#ifndef UFFD_FEATURE_SIGBUS
#define UFFD_FEATURE_SIGBUS (1 << 7)
#endif

/* Features a paging uffd cannot do without. */
#define FM_UFFD_NEED (UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP | \
		      UFFD_FEATURE_PAGEFAULT_FLAG_WP)
/* Paging MAP_SHARED mappings of shmem files (minor faults and write-protect there). */
#define FM_UFFD_SHMEM (UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM)

/*
 * A new userfaultfd with FM_UFFD_NEED and whichever of `want` this kernel
 * offers (UFFD_FEATURE_SIGBUS, UFFD_FEATURE_MOVE, FM_UFFD_SHMEM): *got says
 * which. Returns the descriptor, or -errno with a sentence for the user in err.
 * With UFFD_FEATURE_SIGBUS a process that may not have a full userfaultfd
 * (not root, /dev/userfaultfd closed to it, vm.unprivileged_userfaultfd=0)
 * gets a UFFD_USER_MODE_ONLY one: the same to a SIGBUS-mode pager.
 */
/* A uffd that serves faults taken inside system calls too, before UFFDIO_API (fm_uffd_open_on), or -errno. */
int fm_uffd_open_full_raw(void);
/* fm_uffd_open on fd, a uffd opened before (-1: open one now); fd is closed if the API is refused. */
int fm_uffd_open_on(int fd, uint64_t want, uint64_t *got, char *err, size_t errlen);
int fm_uffd_open(uint64_t want, uint64_t *got, char *err, size_t errlen);
/* The optional features this kernel offers at all (for `farmem doctor` and fm_uffd_open). */
uint64_t fm_uffd_probe(void);

/* UFFDIO_REGISTER; *ioctls gets the ioctls the range allows. */
int fm_uffd_register(int uffd, uintptr_t addr, size_t len, int missing, int wp, int minor, uint64_t *ioctls);
int fm_uffd_unregister(int uffd, uintptr_t addr, size_t len);
/* 1 when the range allows copy and write-protect (and continue, if minor). */
int fm_uffd_can_page(uint64_t ioctls, int minor);

/*
 * Install n pages at dst from src (contiguous) with UFFDIO_COPY, write-
 * protected if wp; wake: wake threads blocked on them (handler threads; in
 * the faulting thread nobody waits). Bit k of *skipped is set for each page
 * k the kernel would not install (see above). Any other failure stops the
 * program. n <= 64.
 */
void fm_uffd_install(int uffd, uintptr_t dst, const void *src, unsigned n, int wp, int wake,
		     uint64_t *skipped);
/* UFFDIO_CONTINUE of one shmem page: 0 mapped (or was there), -EFAULT not in the file, -EAGAIN unmap under way. */
int fm_uffd_continue(int uffd, uintptr_t addr, int wp, int wake);
/* UFFDIO_WRITEPROTECT on (protect) or off. Stops the program on failure. */
void fm_uffd_wp(int uffd, uintptr_t addr, size_t len, int protect);
/* Wake threads blocked in faults on the range (handler-thread mode only). */
void fm_uffd_wake(int uffd, uintptr_t addr, size_t len);
/*
 * The raw UFFDIO_COPY and UFFDIO_MOVE, for callers with rules of their own
 * (fm_pager_move, eviction's moves): 0 or -errno, *done bytes copied or
 * moved before a failure. A move with holes_ok steps over source pages that
 * are not mapped (they count as moved); without, it stops there with ENOENT.
 * A move's destination must be empty when it begins, also when it goes on
 * after EAGAIN: the kernel may have moved pages past the count it gives
 * (uffd_move.h), and only an empty destination tells them apart.
 */
int fm_uffd_copy(int uffd, uintptr_t dst, const void *src, size_t len, int wp, int wake, int64_t *done);
int fm_uffd_move(int uffd, uintptr_t dst, uintptr_t src, size_t len, int holes_ok, int64_t *done);
/*
 * For the calling thread from now on (NULL: none): each ioctl above that may
 * wake a thread asleep in a fault sets *flag to 0 while it runs, then back to
 * what it was. The handler that follows (follow.h) marks its "serving" flag
 * so: the thread it wakes on its CPU takes that CPU at once.
 */
void fm_uffd_mark_wakes(atomic_int *flag);

#endif /* FARMEM_UFFD_OPS_H */
