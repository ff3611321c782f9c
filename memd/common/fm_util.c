// SPDX-License-Identifier: Apache-2.0
#include "fm_util.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int fm_log_level = FM_LOG_WARN;
const char *fm_log_prefix = "farmem";

void fm_log(int level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	char line[1024];
	int n;
	va_list ap;

	if (level > fm_log_level)
		return;
	n = snprintf(line, sizeof(line), "%s: %s: ", fm_log_prefix,
		     names[level < 0 ? 0 : level > 3 ? 3 : level]);
	if (n < 0 || (size_t)n >= sizeof(line))
		n = 0;
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	n = (int)strlen(line);
	if (n > 0 && line[n - 1] != '\n' && (size_t)n + 1 < sizeof(line)) {
		line[n++] = '\n';
		line[n] = '\0';
	}
	/* One write per line so that lines from several threads do not interleave. */
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
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
		ssize_t n = getrandom(p, len, 0);
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
		ssize_t n = read(fd, p, len);
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
		ssize_t n = use_send ? send(fd, p, len, MSG_NOSIGNAL) : write(fd, p, len);
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
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return MAP_FAILED;
	}
	return (void *)r;
}

int fm_sys_munmap(void *addr, size_t len)
{
	long r = syscall(SYS_munmap, addr, len);
	return r ? -1 : 0;
}

int fm_sys_madvise(void *addr, size_t len, int advice)
{
	long r = syscall(SYS_madvise, addr, len, advice);
	return r ? -1 : 0;
}
