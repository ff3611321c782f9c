/* SPDX-License-Identifier: Apache-2.0 */
/* Small helpers shared by memd, the pager and the agent: logging, units, time, checksums. */
#ifndef FARMEM_UTIL_H
#define FARMEM_UTIL_H

#include <pthread.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <isa-l/crc.h>

enum fm_log_level { FM_LOG_ERROR = 0, FM_LOG_WARN = 1, FM_LOG_INFO = 2, FM_LOG_DEBUG = 3 };

extern int fm_log_level;
extern const char *fm_log_prefix;

/*
 * One line to stderr, in one write(2). Signal-safe: it formats with
 * fm_vfmt, not printf, and takes no lock.
 */
void fm_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* What someone watching wants to see, at the default level (warn), with no level word. */
void fm_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define fm_err(...)   fm_log(FM_LOG_ERROR, __VA_ARGS__)
#define fm_warn(...)  fm_log(FM_LOG_WARN, __VA_ARGS__)
#define fm_info(...)  fm_log(FM_LOG_INFO, __VA_ARGS__)
#define fm_debug(...) do { if (fm_log_level >= FM_LOG_DEBUG) fm_log(FM_LOG_DEBUG, __VA_ARGS__); } while (0)

/*
 * snprintf for a signal handler: no allocation, no locale, no lock. The
 * flags "-0# +", width, precision, hh h l ll z j t and d i u x X o p s c %;
 * nothing else (no floating point). Returns the length it would have
 * written, as snprintf does.
 */
int fm_vfmt(char *buf, size_t len, const char *fmt, va_list ap);
int fm_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* fm_fmt into err when err is not NULL (a sentence for the user); returns 0. */
int fm_errmsg(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* strerror's English text, signal-safe (no translation). */
const char *fm_strerror(int err);

/* "error" | "warn" | "info" | "debug" -> level, or -1. */
int fm_log_level_parse(const char *s);

/*
 * Parse a byte size: a number with an optional suffix k, m, g, t (powers of
 * 1024, either case, optional trailing "b"/"ib"). Returns 0 or -EINVAL.
 */
int fm_parse_bytes(const char *s, uint64_t *out);
/* Parse an unsigned integer in [min, max]. Returns 0, -EINVAL or -ERANGE. */
int fm_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

static inline uint64_t fm_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * A moment's pause in a polling loop (about a microsecond for FM_POLL_PAUSES
 * of them): polls that are system calls come less often, and the waiting
 * costs the other hyperthread less.
 */
static inline void fm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}
#define FM_POLL_PAUSES 64

/* The fm_now_ns() deadline timeout_ms from now. */
static inline uint64_t fm_deadline_in(int timeout_ms)
{
	return fm_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
}

/*
 * crc32c (Castagnoli), the standard definition: crc32c("123456789") == 0xe3069283.
 * The pages it checks are mostly cold (memd's store, a page on its way out),
 * and ISA-L's three interleaved streams then wait on one cache line after
 * another: every line of a 4 KiB piece is asked for first (measured on this
 * machine's cold pages: 4.0 GB/s without, 9.1 GB/s with).
 */
static inline uint32_t fm_crc32c(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint32_t crc = 0xffffffffu;

	while (len) {
		size_t n = len < 4096 ? len : 4096;
		if (n >= 1024)
			for (size_t o = 0; o < n; o += 64)
				__builtin_prefetch(p + o);
		crc = crc32_iscsi((unsigned char *)p, (int)n, crc);
		p += n;
		len -= n;
	}
	return ~crc;
}

/*
 * mmap, munmap and madvise straight to the kernel. Library code uses these:
 * in a process under the preload shim the libc names are the shim's own
 * interposers, which must only ever see the program's calls.
 */
void *fm_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off);
int fm_sys_munmap(void *addr, size_t len);
int fm_sys_madvise(void *addr, size_t len, int advice);

/*
 * The data-moving system calls straight to the kernel, for the same reason:
 * under the shim, read/write/send/recv are covers that make paged buffers
 * resident first, and the pager's own I/O (a write-back reads pages it is
 * evicting) must never wait on itself there.
 */
struct msghdr;
struct iovec;
long fm_sys_read(int fd, void *buf, size_t len);
long fm_sys_readv(int fd, const struct iovec *iov, int n);
long fm_sys_write(int fd, const void *buf, size_t len);
long fm_sys_send(int fd, const void *buf, size_t len, int flags);
long fm_sys_sendmsg(int fd, const struct msghdr *m, int flags);
long fm_sys_recvmsg(int fd, struct msghdr *m, int flags);
/* And the wait for a descriptor (the shim's poll pins the program's arrays, under the pager's locks). */
struct pollfd;
int fm_sys_poll(struct pollfd *fds, unsigned long n, int timeout_ms);
struct epoll_event;
int fm_sys_epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout_ms);
/* And the capture's splice of pages into its pipe (the shim's vmsplice pins the program's pages). */
long fm_sys_vmsplice(int fd, const struct iovec *iov, unsigned long n, unsigned int flags);

/* Fill buf with len bytes from getrandom(2). Returns 0 or -errno. */
int fm_random(void *buf, size_t len);

/*
 * The memory cgroup named in text, the contents of /proc/PID/cgroup (taken
 * apart in place): cgroup v1's memory hierarchy, else v2's unified one
 * ("0::PATH"). 0, or -1 when it names neither or out is too short.
 */
int fm_memory_cgroup(char *text, char *out, size_t cap);
/*
 * A small file (a /proc one) in buf, NUL-terminated, with one read
 * (fm_sys_read: no shim cover): its length, or -1 when it cannot be read or
 * is empty. At most cap - 1 bytes.
 */
long fm_read_file(const char *path, char *buf, size_t cap);
/* Read and write exactly len bytes, retrying on EINTR and short transfers. */
int fm_read_full(int fd, void *buf, size_t len);
int fm_write_full(int fd, const void *buf, size_t len);

/*
 * pthread_create for a thread of farmem's own (a pager's, memd's client's):
 * it blocks every signal but those of faults, so that a signal sent to the
 * process never lands on it. The kernel gives such a signal to any thread
 * that does not block it, and a program that waits for SIGTERM with
 * signalfd or sigwait (all its threads blocking it) died of it on a pager
 * thread: yrmcds under farmem, status 143 where it exits 0.
 */
int fm_thread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

#endif /* FARMEM_UTIL_H */
