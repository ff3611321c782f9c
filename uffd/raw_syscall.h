/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The syscall instruction itself, with glibc's syscall()'s result (-1 and
 * errno): for calls that must not go through a cover (the shim's syscall()
 * before its covers are bound) and for tests of what no cover can see
 * (tests/progs/iotest.c, --only raw). Header only: test programs link
 * nothing of farmem's. x86-64 only; elsewhere ENOSYS.
 */
#ifndef FARMEM_RAW_SYSCALL_H
#define FARMEM_RAW_SYSCALL_H

#include <errno.h>

static inline long fm_raw_syscall6(long n, long a1, long a2, long a3, long a4, long a5, long a6)
{
#if defined(__x86_64__)
	long r;
	register long r10 __asm__("r10") = a4;
	register long r8 __asm__("r8") = a5;
	register long r9 __asm__("r9") = a6;

	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return -1;
	}
	return r;
#else
	(void)n, (void)a1, (void)a2, (void)a3, (void)a4, (void)a5, (void)a6;
	errno = ENOSYS;
	return -1;
#endif
}

#endif
