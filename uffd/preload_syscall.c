// SPDX-License-Identifier: Apache-2.0
/*
 * The shim's cover for glibc's syscall(): a program that maps, unmaps or
 * protects its memory, moves data or waits on a futex through syscall(N, ...)
 * instead of the functions the shim covers gets the same covers.
 *
 * SBCL maps its Lisp heap with syscall(SYS_mmap, ...): a 2 GiB writable
 * mapping the shim never saw, so nothing of it was paged. Had it been paged
 * some other way, a madvise(MADV_DONTNEED) through syscall() would have
 * dropped pages behind the pager's back, and a raw read into an evicted
 * buffer would fail with EFAULT under fault=signal.
 *
 * Every other number goes to libc's syscall() unchanged. So does every call
 * made by farmem's own code, which reaches the kernel through syscall()
 * (fm_util.c, the shim's sys_mmap): a call from the shim's own text is never
 * covered, or the shim's mmap would call itself.
 */
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>

#include "pager.h"
#include "preload.h"
#include "raw_syscall.h"

#define EXPORT __attribute__((visibility("default")))

/* The ELF header of this shared object, where the loader mapped it (the linker's symbol). */
extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden")));

static uintptr_t own_lo, own_hi;

/*
 * The shim's executable segments, read from its own program headers: no
 * loader call (this may run first inside the SIGBUS handler, where a lock the
 * loader holds could be held by the interrupted code).
 */
static void own_text(void)
{
	const ElfW(Ehdr) *eh = &__ehdr_start;
	const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
	uintptr_t base = (uintptr_t)eh, lo = UINTPTR_MAX, hi = 0;

	for (unsigned k = 0; k < eh->e_phnum; k++)
		if (ph[k].p_type == PT_LOAD && !ph[k].p_offset)
			base = (uintptr_t)eh - ph[k].p_vaddr;
	for (unsigned k = 0; k < eh->e_phnum; k++)
		if (ph[k].p_type == PT_LOAD && (ph[k].p_flags & PF_X)) {
			if (base + ph[k].p_vaddr < lo)
				lo = base + ph[k].p_vaddr;
			if (base + ph[k].p_vaddr + ph[k].p_memsz > hi)
				hi = base + ph[k].p_vaddr + ph[k].p_memsz;
		}
	__atomic_store_n(&own_hi, hi, __ATOMIC_RELAXED);
	__atomic_store_n(&own_lo, lo, __ATOMIC_RELEASE);
}

static int from_shim(uintptr_t ra)
{
	if (!__atomic_load_n(&own_lo, __ATOMIC_ACQUIRE))
		own_text();
	return ra >= __atomic_load_n(&own_lo, __ATOMIC_ACQUIRE) && ra < __atomic_load_n(&own_hi, __ATOMIC_RELAXED);
}

FM_IO_NEXT(syscall_next, "syscall");

static long libc_syscall(long n, const long a[6])
{
	long (*f)(long, ...) = (long (*)(long, ...))fm_io_next(&syscall_next);

	if (f)
		return f(n, a[0], a[1], a[2], a[3], a[4], a[5]);
	/* Before the covers are bound (another library's constructor): the instruction itself, as libc's does it. */
	return fm_raw_syscall6(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* The futex operations that name a second word. */
static int futex_second_word(long op)
{
	switch (op & FUTEX_CMD_MASK) {
	case FUTEX_REQUEUE:
	case FUTEX_CMP_REQUEUE:
	case FUTEX_WAKE_OP:
	case FUTEX_WAIT_REQUEUE_PI:
	case FUTEX_CMP_REQUEUE_PI:
		return 1;
	}
	return 0;
}

/*
 * The kernel reads the futex word (and a requeue's second word), and sleeps
 * with it: both resident and pinned for the call, as preload_sync.c does for
 * glibc's own waits. syscall() is not a cancellation point, so no cleanup.
 */
static long futex_call(const long a[6])
{
	struct fm_io_pins io = { .p = fm_preload_pager_nowait() };
	const void *w1 = (const void *)a[0], *w2 = (const void *)a[4];
	long r;
	int e;

	if (io.p && fm_pager_io_needed(io.p, w1, sizeof(uint32_t)))
		fm_io_pin(&io, w1, sizeof(uint32_t), 1);
	if (io.p && futex_second_word(a[1]) && fm_pager_io_needed(io.p, w2, sizeof(uint32_t)))
		fm_io_pin(&io, w2, sizeof(uint32_t), 1);
	r = libc_syscall(SYS_futex, a);
	e = errno;
	fm_io_unpin(&io);
	errno = e;
	return r;
}

/*
 * Any other number: the kernel may read or write a small struct an argument
 * points at (rt_sigprocmask's sets, from Python's ctypes), and fails with
 * EFAULT where that memory is paged by SIGBUS and not resident. Whatever
 * argument points into such memory has its first bytes made resident,
 * writable, and pinned for the call; no retry, which could repeat a side
 * effect. An integer that happens to look like such an address costs a
 * page's fault, nothing else. The rest of a large buffer is not covered.
 */
static long other_call(long n, const long a[6])
{
	struct fm_io_pins io = { .p = fm_preload_pager_nowait() };
	long r;
	int e;

	if (!io.p)
		return libc_syscall(n, a);
	for (int k = 0; k < 6; k++)
		if (fm_pager_io_needed(io.p, (const void *)a[k], 64))
			fm_io_pin(&io, (const void *)a[k], 64, 1);
	if (!io.n)
		return libc_syscall(n, a);
	r = libc_syscall(n, a);
	e = errno;
	fm_io_unpin(&io);
	errno = e;
	return r;
}

EXPORT long syscall(long n, ...)
{
	va_list ap;
	long a[6];

	/* As libc's: six argument registers, whatever the call uses. */
	va_start(ap, n);
	for (int k = 0; k < 6; k++)
		a[k] = va_arg(ap, long);
	va_end(ap);
	if (from_shim((uintptr_t)__builtin_return_address(0)))
		return libc_syscall(n, a);
	switch (n) {
	case SYS_mmap:
		return (long)fm_shim_mmap((void *)a[0], (size_t)a[1], (int)a[2], (int)a[3], (int)a[4], (off_t)a[5],
					  __builtin_return_address(0));
	case SYS_munmap:
		return munmap((void *)a[0], (size_t)a[1]);
	case SYS_mremap:
		return (long)mremap((void *)a[0], (size_t)a[1], (size_t)a[2], (int)a[3], (void *)a[4]);
	case SYS_mprotect:
		return mprotect((void *)a[0], (size_t)a[1], (int)a[2]);
	case SYS_madvise:
		return madvise((void *)a[0], (size_t)a[1], (int)a[2]);
	case SYS_read:
		return read((int)a[0], (void *)a[1], (size_t)a[2]);
	case SYS_write:
		return write((int)a[0], (const void *)a[1], (size_t)a[2]);
	case SYS_pread64:
		return pread((int)a[0], (void *)a[1], (size_t)a[2], (off_t)a[3]);
	case SYS_pwrite64:
		return pwrite((int)a[0], (const void *)a[1], (size_t)a[2], (off_t)a[3]);
	case SYS_readv:
		return readv((int)a[0], (const struct iovec *)a[1], (int)a[2]);
	case SYS_writev:
		return writev((int)a[0], (const struct iovec *)a[1], (int)a[2]);
	case SYS_recvfrom:
		return recvfrom((int)a[0], (void *)a[1], (size_t)a[2], (int)a[3], (struct sockaddr *)a[4],
				(socklen_t *)a[5]);
	case SYS_sendto:
		return sendto((int)a[0], (const void *)a[1], (size_t)a[2], (int)a[3], (const struct sockaddr *)a[4],
			      (socklen_t)a[5]);
	case SYS_recvmsg:
		return recvmsg((int)a[0], (struct msghdr *)a[1], (int)a[2]);
	case SYS_sendmsg:
		return sendmsg((int)a[0], (const struct msghdr *)a[1], (int)a[2]);
	case SYS_getrandom:
		return getrandom((void *)a[0], (size_t)a[1], (unsigned int)a[2]);
	case SYS_process_vm_readv:
		return process_vm_readv((pid_t)a[0], (const struct iovec *)a[1], (unsigned long)a[2],
					(const struct iovec *)a[3], (unsigned long)a[4], (unsigned long)a[5]);
	case SYS_process_vm_writev:
		return process_vm_writev((pid_t)a[0], (const struct iovec *)a[1], (unsigned long)a[2],
					 (const struct iovec *)a[3], (unsigned long)a[4], (unsigned long)a[5]);
	case SYS_futex:
		return futex_call(a);
	case SYS_ioctl:
		if ((unsigned long)a[1] == UFFDIO_REGISTER)
			return ioctl((int)a[0], (unsigned long)a[1], (void *)a[2]);
		break;
	case SYS_io_uring_setup:
		fm_shim_async_io("io_uring through syscall()");
		break;
	case SYS_io_setup:
		fm_shim_async_io("native AIO through syscall()");
		break;
	}
	return other_call(n, a);
}
