// SPDX-License-Identifier: Apache-2.0
/* Every UFFDIO_* ioctl of the pager (uffd_ops.h says why they are in one place). */
#include "uffd_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fm_fds.h"
#include "fm_util.h"
#include "fatal.h"
#include "uffd_move.h"

#define PG 4096u

/* initial-exec: a dynamic TLS access may call malloc, and a handler must never (the heap may be paged). */
static __thread atomic_int *wakes_flag __attribute__((tls_model("initial-exec")));

void fm_uffd_mark_wakes(atomic_int *flag)
{
	wakes_flag = flag;
}

/* Returns what to put back (wake_end), -1 for nothing. */
static int wake_begin(int wake)
{
	return wake && wakes_flag ? atomic_exchange_explicit(wakes_flag, 0, memory_order_relaxed) : -1;
}

static void wake_end(int was)
{
	if (was >= 0)
		atomic_store_explicit(wakes_flag, was, memory_order_relaxed);
}

/*
 * A uffd that serves kernel faults too (/dev/userfaultfd, else the system
 * call, which needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1), else,
 * with user_only_ok, one that serves only faults taken in user mode
 * (UFFD_USER_MODE_ONLY, any user since 5.11): a fault taken inside a system
 * call then fails with EFAULT, which is what UFFD_FEATURE_SIGBUS does to it
 * anyway. *user_only says which it is.
 */
static int open_raw(int user_only_ok, int *user_only)
{
	int fd = -1, dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);

	*user_only = 0;
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
		close(dev);
	}
	if (fd < 0)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0 && user_only_ok) {
		int full_errno = errno;
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
		if (fd >= 0)
			*user_only = 1;
		else
			errno = full_errno;
	}
	if (fd < 0)
		return -errno;
	return fm_fd_keep(fd);
}

/* A uffd takes one UFFDIO_API: a throwaway one asks what the kernel offers. */
uint64_t fm_uffd_probe(void)
{
	struct uffdio_api api = { .api = UFFD_API };
	uint64_t f = 0;
	int user_only, fd = open_raw(1, &user_only);

	if (fd < 0)
		return 0;
	if (!ioctl(fd, UFFDIO_API, &api))
		f = api.features;
	close(fd);
	return f;
}

int fm_uffd_open(uint64_t want, uint64_t *got, char *err, size_t errlen)
{
	return fm_uffd_open_on(-1, want, got, err, errlen);
}

int fm_uffd_open_full_raw(void)
{
	int user_only;

	return open_raw(0, &user_only);
}

int fm_uffd_open_on(int fd, uint64_t want, uint64_t *got, char *err, size_t errlen)
{
	uint64_t offered = fm_uffd_probe(), ask;
	struct uffdio_api api;
	int user_only;

	/* With SIGBUS a fault inside a system call fails with EFAULT whatever the uffd: user-mode-only does. */
	if (fd < 0)
		fd = open_raw(!!(want & offered & UFFD_FEATURE_SIGBUS), &user_only);
	if (fd < 0) {
		snprintf(err, errlen, "userfaultfd is not available to this process (%s): %s; run `farmem doctor`",
			 fm_strerror(-fd),
			 want & UFFD_FEATURE_SIGBUS
				 ? "this kernel has no UFFD_USER_MODE_ONLY (5.11+), and a userfaultfd for kernel faults "
				   "needs root, access to /dev/userfaultfd, or vm.unprivileged_userfaultfd=1"
				 : "fault=thread needs one that also serves faults taken inside system calls: root, "
				   "access to /dev/userfaultfd, or vm.unprivileged_userfaultfd=1 (fault=signal works "
				   "without)");
		return fd;
	}
	/* The shmem features only come as a pair. */
	if ((offered & FM_UFFD_SHMEM) != FM_UFFD_SHMEM)
		offered &= ~(uint64_t)FM_UFFD_SHMEM;
	ask = FM_UFFD_NEED | (want & offered);
	api = (struct uffdio_api){ .api = UFFD_API, .features = ask };
	if (ioctl(fd, UFFDIO_API, &api)) {
		snprintf(err, errlen, "UFFDIO_API refused features 0x%llx (%s): this kernel lacks "
			 "write-protect or thread-id support; run `farmem doctor`",
			 (unsigned long long)ask, fm_strerror(errno));
		close(fd);
		return -ENOTSUP;
	}
	*got = ask;
	return fd;
}

int fm_uffd_register(int uffd, uintptr_t addr, size_t len, int missing, int wp, int minor, uint64_t *ioctls)
{
	struct uffdio_register reg = {
		.range = { .start = addr, .len = len },
		.mode = (missing ? UFFDIO_REGISTER_MODE_MISSING : 0) | (wp ? UFFDIO_REGISTER_MODE_WP : 0) |
			(minor ? UFFDIO_REGISTER_MODE_MINOR : 0),
	};

	/* Not through ioctl(): the shim's cover of it is for the program's own userfaultfd (preload.c). */
	if (syscall(SYS_ioctl, uffd, UFFDIO_REGISTER, &reg))
		return -errno;
	if (ioctls)
		*ioctls = reg.ioctls;
	return 0;
}

int fm_uffd_unregister(int uffd, uintptr_t addr, size_t len)
{
	struct uffdio_range r = { .start = addr, .len = len };

	return ioctl(uffd, UFFDIO_UNREGISTER, &r) ? -errno : 0;
}

int fm_uffd_can_page(uint64_t ioctls, int minor)
{
	return (ioctls & (1ull << _UFFDIO_COPY)) && (ioctls & (1ull << _UFFDIO_WRITEPROTECT)) &&
	       (!minor || (ioctls & (1ull << _UFFDIO_CONTINUE)));
}

int fm_uffd_copy(int uffd, uintptr_t dst, const void *src, size_t len, int wp, int wake, int64_t *done)
{
	struct uffdio_copy c = {
		.dst = dst, .src = (uintptr_t)src, .len = len,
		.mode = (wp ? UFFDIO_COPY_MODE_WP : 0) | (wake ? 0 : UFFDIO_COPY_MODE_DONTWAKE),
	};
	int was = wake_begin(wake), rc = ioctl(uffd, UFFDIO_COPY, &c) ? -errno : 0;

	wake_end(was);

	if (done)
		*done = rc ? (c.copy > 0 ? c.copy : 0) : (int64_t)len;
	return rc;
}

void fm_uffd_install(int uffd, uintptr_t dst, const void *src, unsigned n, int wp, int wake,
		     uint64_t *skipped)
{
	int64_t done;
	int rc = fm_uffd_copy(uffd, dst, src, (size_t)n * PG, wp, wake, &done);
	unsigned k;

	*skipped = 0;
	if (!rc)
		return;
	if (rc != -EEXIST && rc != -EAGAIN && rc != -ENOENT)
		fm_fatal("UFFDIO_COPY of %u pages at %#lx failed: %s", n, (unsigned long)dst, fm_strerror(-rc));
	/* The rest one by one: a page the kernel skips is not ours, the ones after it may be. */
	for (k = (unsigned)(done / PG); k < n; k++) {
		uintptr_t d = dst + (uintptr_t)k * PG;
		rc = fm_uffd_copy(uffd, d, (const uint8_t *)src + (size_t)k * PG, PG, wp, wake, NULL);
		if (rc == -EEXIST || rc == -EAGAIN || rc == -ENOENT) {
			*skipped |= 1ull << k;
			if (wake)
				fm_uffd_wake(uffd, d, PG);
		} else if (rc) {
			fm_fatal("UFFDIO_COPY at %#lx failed: %s", (unsigned long)d, fm_strerror(-rc));
		}
	}
}

int fm_uffd_continue(int uffd, uintptr_t addr, int wp, int wake)
{
	struct uffdio_continue c = {
		.range = { .start = addr, .len = PG },
		.mode = (wp ? UFFDIO_CONTINUE_MODE_WP : 0) | (wake ? 0 : UFFDIO_CONTINUE_MODE_DONTWAKE),
	};
	int was = wake_begin(wake), rc = ioctl(uffd, UFFDIO_CONTINUE, &c), e = errno;

	wake_end(was);
	if (rc == 0)
		return 0;
	if (e != EEXIST && e != EFAULT && e != EAGAIN)
		fm_fatal("UFFDIO_CONTINUE at %#lx failed: %s", (unsigned long)addr, fm_strerror(e));
	if (wake)
		fm_uffd_wake(uffd, addr, PG);
	return e == EEXIST ? 0 : -e;
}

void fm_uffd_wp(int uffd, uintptr_t addr, size_t len, int protect)
{
	struct uffdio_writeprotect wp = {
		.range = { .start = addr, .len = len },
		.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};
	/* Unprotecting wakes the writers that wait there. */
	int was = wake_begin(!protect), rc = ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);

	wake_end(was);
	if (rc)
		fm_fatal("UFFDIO_WRITEPROTECT %s of %#lx+%zu pages failed: %s", protect ? "on" : "off",
			 (unsigned long)addr, len / PG, fm_strerror(errno));
}

void fm_uffd_wake(int uffd, uintptr_t addr, size_t len)
{
	struct uffdio_range r = { .start = addr, .len = len };
	int was = wake_begin(1);

	/* Only fails for a range that is not registered any more: then nobody waits there. */
	(void)ioctl(uffd, UFFDIO_WAKE, &r);
	wake_end(was);
}

int fm_uffd_move(int uffd, uintptr_t dst, uintptr_t src, size_t len, int holes_ok, int64_t *done)
{
	uint64_t moved = 0;
	int was = wake_begin(1);
	int rc = fm_move_to_empty(uffd, dst, src, len, holes_ok ? UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES : 0, &moved, NULL);

	wake_end(was);
	*done = (int64_t)moved;
	return rc;
}
