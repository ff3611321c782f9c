// SPDX-License-Identifier: Apache-2.0
#include "fm_fds.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FDS_HIGH 512 /* where farmem's descriptors go: above what programs and scripts pick, a small fd table */

struct fd_key {
	uint64_t dev, ino;
};

static uint64_t owned[FM_FDS_MAX / 64];
static struct fd_key keys[FM_FDS_MAX];

/* Raw: the shim's covers are not to see farmem's own calls. */
static int key_of(int fd, struct fd_key *k)
{
	struct stat st;

	if (syscall(SYS_fstat, fd, &st))
		return -1;
	k->dev = (uint64_t)st.st_dev;
	k->ino = (uint64_t)st.st_ino;
	return 0;
}

void fm_fd_own(int fd)
{
	struct fd_key k;

	if (fd < 0 || fd >= FM_FDS_MAX || key_of(fd, &k))
		return;
	__atomic_store_n(&keys[fd].dev, k.dev, __ATOMIC_RELAXED);
	__atomic_store_n(&keys[fd].ino, k.ino, __ATOMIC_RELAXED);
	__atomic_fetch_or(&owned[fd / 64], 1ull << (fd % 64), __ATOMIC_RELEASE);
}

void fm_fd_disown(int fd)
{
	if (fd >= 0 && fd < FM_FDS_MAX)
		__atomic_fetch_and(&owned[fd / 64], ~(1ull << (fd % 64)), __ATOMIC_RELEASE);
}

int fm_fd_owned(int fd)
{
	struct fd_key k;

	if (fd < 0 || fd >= FM_FDS_MAX || !(__atomic_load_n(&owned[fd / 64], __ATOMIC_ACQUIRE) & (1ull << (fd % 64))))
		return 0;
	if (key_of(fd, &k) || k.dev != __atomic_load_n(&keys[fd].dev, __ATOMIC_RELAXED) ||
	    k.ino != __atomic_load_n(&keys[fd].ino, __ATOMIC_RELAXED)) {
		fm_fd_disown(fd); /* closed by farmem without a word, and the number taken again since */
		return 0;
	}
	return 1;
}

int fm_fd_close(int fd)
{
	if (!fm_fd_owned(fd)) {
		errno = EBADF;
		return -1;
	}
	fm_fd_disown(fd);
	return (int)syscall(SYS_close, fd);
}

static long fds_base(void)
{
	struct rlimit nofile;
	long base = FDS_HIGH;

	if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur != RLIM_INFINITY && (long)nofile.rlim_cur / 2 < base)
		base = (long)nofile.rlim_cur / 2;
	return base;
}

void fm_fds_widen(void)
{
	long wide = -1;

	for (int fd = 0; fd < 3 && wide < 0; fd++)
		wide = syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, fds_base());
	if (wide >= 0)
		syscall(SYS_close, wide);
}

int fm_fd_keep(int fd)
{
	long base = fds_base(), hi;

	if (fd < 0)
		return fd;
	if (fd < base && (hi = syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, base)) >= 0) {
		syscall(SYS_close, fd);
		fd = (int)hi;
	}
	fm_fd_own(fd);
	return fd;
}
