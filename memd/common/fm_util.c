// SPDX-License-Identifier: Apache-2.0
#include "fm_util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int fm_log_level = FM_LOG_WARN;
const char *fm_log_prefix = "farmem";

/*
 * A printf subset with no allocation, no locale and no lock, so that a
 * message can be formatted in a signal handler (the pager resolves faults in
 * the faulting thread's SIGBUS handler; the transports log from there). It
 * knows the flags "-0# +", a width and a precision (digits or *), the length
 * modifiers hh h l ll z j t, and d i u x X o p s c %: all that farmem's
 * messages use. Anything else is copied as it stands.
 */
struct fmt_out { char *p; size_t left; size_t n; };

static void put(struct fmt_out *o, char c)
{
	if (o->left > 1) {
		*o->p++ = c;
		o->left--;
	}
	o->n++;
}

static void put_padded(struct fmt_out *o, const char *s, size_t len, int width, int left, char padc)
{
	size_t pad = width > 0 && (size_t)width > len ? (size_t)width - len : 0;

	/* Zero padding goes after a sign or 0x prefix, which the caller put first in s. */
	if (!left && padc == '0') {
		while (len && (*s == '-' || *s == '+' || *s == ' ' || (*s == '0' && len > 1 && (s[1] == 'x' || s[1] == 'X')))) {
			size_t k = *s == '0' ? 2 : 1;
			for (size_t i = 0; i < k; i++)
				put(o, s[i]);
			s += k;
			len -= k;
		}
	}
	if (!left)
		while (pad--)
			put(o, padc);
	for (size_t i = 0; i < len; i++)
		put(o, s[i]);
	if (left)
		while (pad--)
			put(o, ' ');
}

int fm_vfmt(char *buf, size_t len, const char *fmt, va_list ap)
{
	struct fmt_out o = { buf, len, 0 };

	for (const char *f = fmt; *f; f++) {
		const char *spec = f;
		int left = 0, zero = 0, alt = 0, plus = 0, space = 0, width = -1, prec = -1, lng = 0, sz = 0;
		char num[72], *e = num + sizeof(num), *q = e;
		unsigned long long u;
		int neg = 0, base = 10, upper = 0;

		if (*f != '%') {
			put(&o, *f);
			continue;
		}
		for (f++;; f++) {
			if (*f == '-') left = 1;
			else if (*f == '0') zero = 1;
			else if (*f == '#') alt = 1;
			else if (*f == '+') plus = 1;
			else if (*f == ' ') space = 1;
			else break;
		}
		if (*f == '*') {
			width = va_arg(ap, int);
			if (width < 0) {
				left = 1;
				width = -width;
			}
			f++;
		} else {
			for (width = 0; *f >= '0' && *f <= '9'; f++)
				width = width * 10 + (*f - '0');
		}
		if (*f == '.') {
			f++;
			if (*f == '*') {
				prec = va_arg(ap, int);
				f++;
			} else {
				for (prec = 0; *f >= '0' && *f <= '9'; f++)
					prec = prec * 10 + (*f - '0');
			}
		}
		if (*f == 'h') {
			f++;
			if (*f == 'h')
				f++;
		} else if (*f == 'l') {
			lng = 1;
			f++;
			if (*f == 'l') {
				lng = 2;
				f++;
			}
		} else if (*f == 'z' || *f == 'j' || *f == 't') {
			sz = 1;
			f++;
		}
		switch (*f) {
		case '%':
			put(&o, '%');
			continue;
		case 'c':
			num[0] = (char)va_arg(ap, int);
			put_padded(&o, num, 1, width, left, ' ');
			continue;
		case 's': {
			const char *s = va_arg(ap, const char *);
			size_t n = 0;
			if (!s)
				s = "(null)";
			while (s[n] && (prec < 0 || n < (size_t)prec))
				n++;
			put_padded(&o, s, n, width, left, ' ');
			continue;
		}
		case 'd': case 'i': {
			long long v = sz ? (long long)va_arg(ap, ssize_t) : lng == 2 ? va_arg(ap, long long)
				    : lng ? va_arg(ap, long) : va_arg(ap, int);
			neg = v < 0;
			u = neg ? 0ull - (unsigned long long)v : (unsigned long long)v;
			break;
		}
		case 'X':
			upper = 1;
			/* fall through */
		case 'x': case 'o': case 'u': case 'p':
			base = *f == 'u' ? 10 : *f == 'o' ? 8 : 16;
			if (*f == 'p') {
				u = (uintptr_t)va_arg(ap, void *);
				alt = 1;
				if (!u) {  /* as glibc prints it */
					put_padded(&o, "(nil)", 5, width, left, ' ');
					continue;
				}
			} else {
				u = sz ? (unsigned long long)va_arg(ap, size_t) : lng == 2 ? va_arg(ap, unsigned long long)
				    : lng ? va_arg(ap, unsigned long) : va_arg(ap, unsigned int);
			}
			break;
		default:  /* unknown: as it stands */
			for (const char *c = spec; c <= f && *c; c++)
				put(&o, *c);
			if (!*f)
				f--;
			continue;
		}
		do {
			*--q = (upper ? "0123456789ABCDEF" : "0123456789abcdef")[u % (unsigned)base];
			u /= (unsigned)base;
		} while (u);
		while (prec >= 0 && e - q < prec)
			*--q = '0';
		if (alt && base == 16 && !(q[0] == '0' && e - q == 1)) {
			*--q = upper ? 'X' : 'x';
			*--q = '0';
		}
		if (neg)
			*--q = '-';
		else if (plus && (*f == 'd' || *f == 'i'))
			*--q = '+';
		else if (space && (*f == 'd' || *f == 'i'))
			*--q = ' ';
		put_padded(&o, q, (size_t)(e - q), width, left, zero && !left && prec < 0 ? '0' : ' ');
	}
	if (len)
		*o.p = '\0';
	return (int)o.n;
}

int fm_fmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = fm_vfmt(buf, len, fmt, ap);
	va_end(ap);
	return n;
}

int fm_errmsg(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return 0;
	va_start(ap, fmt);
	fm_vfmt(err, errlen, fmt, ap);
	va_end(ap);
	return 0;
}

const char *fm_strerror(int err)
{
	/* strerror() may translate, and so allocate: the C locale's text is a table lookup. */
	const char *s = strerrordesc_np(err < 0 ? -err : err);
	return s ? s : "unknown error";
}

static void vlog(const char *tag, const char *fmt, va_list ap)
{
	char line[1024];
	size_t n;

	n = (size_t)fm_fmt(line, sizeof(line), tag ? "%s: %s: " : "%s: ", fm_log_prefix, tag);
	if (n >= sizeof(line))
		n = 0;
	fm_vfmt(line + n, sizeof(line) - n, fmt, ap);
	n = strlen(line);
	if (n > 0 && line[n - 1] != '\n' && n + 1 < sizeof(line)) {
		line[n++] = '\n';
		line[n] = '\0';
	}
	/* One write per line so that lines from several threads do not interleave. */
	if (fm_sys_write(STDERR_FILENO, line, n) < 0)
		return;
}

void fm_log(int level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	va_list ap;

	if (level > fm_log_level)
		return;
	va_start(ap, fmt);
	vlog(names[level < 0 ? 0 : level > 3 ? 3 : level], fmt, ap);
	va_end(ap);
}

void fm_notice(const char *fmt, ...)
{
	va_list ap;

	if (fm_log_level < FM_LOG_WARN)
		return;
	va_start(ap, fmt);
	vlog(NULL, fmt, ap);
	va_end(ap);
}

int fm_log_level_parse(const char *s)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	for (int i = 0; i < 4; i++)
		if (strcasecmp(s, names[i]) == 0)
			return i;
	return -1;
}

int fm_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (*end != '\0')
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int fm_parse_bytes(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -EINVAL;
	switch (tolower((unsigned char)*end)) {
	case '\0': break;
	case 'k': shift = 10; end++; break;
	case 'm': shift = 20; end++; break;
	case 'g': shift = 30; end++; break;
	case 't': shift = 40; end++; break;
	default: return -EINVAL;
	}
	if (shift && tolower((unsigned char)*end) == 'i')
		end++;
	if (tolower((unsigned char)*end) == 'b')
		end++;
	if (*end != '\0')
		return -EINVAL;
	if (shift && v > (~0ull >> shift))
		return -EINVAL;
	*out = v << shift;
	return 0;
}

int fm_random(void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = syscall(SYS_getrandom, p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int fm_read_full(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = fm_sys_read(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int fm_write_full(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	int use_send = 1;
	while (len) {
		/* MSG_NOSIGNAL: a vanished peer must not SIGPIPE the program we page. */
		ssize_t n = use_send ? fm_sys_send(fd, p, len, MSG_NOSIGNAL) : fm_sys_write(fd, p, len);
		if (n < 0 && use_send && errno == ENOTSOCK) {
			use_send = 0;
			continue;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

void *fm_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, long off)
{
	/* glibc's syscall() returns -1 (MAP_FAILED) and sets errno on failure. */
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

int fm_sys_munmap(void *addr, size_t len)
{
	long r = syscall(SYS_munmap, addr, len);
	return r ? -1 : 0;
}

long fm_sys_read(int fd, void *buf, size_t len)
{
	return syscall(SYS_read, fd, buf, len);
}

long fm_sys_readv(int fd, const struct iovec *iov, int n)
{
	return syscall(SYS_readv, fd, iov, n);
}

long fm_sys_write(int fd, const void *buf, size_t len)
{
	return syscall(SYS_write, fd, buf, len);
}

long fm_sys_send(int fd, const void *buf, size_t len, int flags)
{
	return syscall(SYS_sendto, fd, buf, len, flags, NULL, 0);
}

long fm_sys_sendmsg(int fd, const struct msghdr *m, int flags)
{
	return syscall(SYS_sendmsg, fd, m, flags);
}

long fm_sys_recvmsg(int fd, struct msghdr *m, int flags)
{
	return syscall(SYS_recvmsg, fd, m, flags);
}

int fm_sys_poll(struct pollfd *fds, unsigned long n, int timeout_ms)
{
	struct timespec t = { .tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000 };

	return (int)syscall(SYS_ppoll, fds, n, timeout_ms < 0 ? NULL : &t, NULL, 0);
}

int fm_sys_epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout_ms)
{
	return (int)syscall(SYS_epoll_pwait, epfd, ev, max, timeout_ms, NULL, 0);
}

long fm_sys_vmsplice(int fd, const struct iovec *iov, unsigned long n, unsigned int flags)
{
	return syscall(SYS_vmsplice, fd, iov, n, flags);
}

int fm_sys_madvise(void *addr, size_t len, int advice)
{
	long r = syscall(SYS_madvise, addr, len, advice);
	return r ? -1 : 0;
}

long fm_read_file(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	long n;

	if (fd < 0)
		return -1;
	n = fm_sys_read(fd, buf, cap - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	return n;
}

int fm_memory_cgroup(char *text, char *out, size_t cap)
{
	char *line, *save = NULL;
	int found = 0;

	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *ctl = strchr(line, ':'), *cg = ctl ? strchr(ctl + 1, ':') : NULL;
		int v1;

		if (!cg)
			continue;
		*ctl++ = 0;
		*cg++ = 0;
		v1 = !strcmp(ctl, "memory") || !strncmp(ctl, "memory,", 7) || strstr(ctl, ",memory,") ||
		     (strlen(ctl) >= 7 && !strcmp(ctl + strlen(ctl) - 7, ",memory"));
		if (!v1 && !(!strcmp(line, "0") && !*ctl))
			continue;
		if (fm_fmt(out, cap, "%s", cg) >= (int)cap)
			return -1;
		found = 1;
		if (v1)
			break;
	}
	return found ? 0 : -1;
}

int fm_thread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	static const int faults[] = { SIGBUS, SIGSEGV, SIGILL, SIGFPE, SIGTRAP };
	sigset_t quiet, was;
	int rc;

	/* glibc's sigfillset leaves out its own signals (SIGCANCEL, SIGSETXID: setuid needs every thread). */
	sigfillset(&quiet);
	for (size_t k = 0; k < sizeof(faults) / sizeof(faults[0]); k++)
		sigdelset(&quiet, faults[k]);
	/* The kernel's call, not a pthread_sigmask the preload shim may cover. */
	if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &quiet, &was, sizeof(uint64_t)))
		return errno;
	rc = pthread_create(th, attr, fn, arg);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &was, NULL, sizeof(uint64_t));
	return rc;
}
