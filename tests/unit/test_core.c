// SPDX-License-Identifier: Apache-2.0
/* Unit tests of the pieces every component shares: units, knobs, checksums, histogram, auth, formatting. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "auth.h"
#include "fm_fds.h"
#include "fm_util.h"
#include "pager.h"
#include "resmap.h"

static int failures;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

static void test_units(void)
{
	uint64_t v;
	CHECK(fm_parse_bytes("64M", &v) == 0 && v == 64ull << 20);
	CHECK(fm_parse_bytes("2g", &v) == 0 && v == 2ull << 30);
	CHECK(fm_parse_bytes("512MiB", &v) == 0 && v == 512ull << 20);
	CHECK(fm_parse_bytes("4096", &v) == 0 && v == 4096);
	CHECK(fm_parse_bytes("1kb", &v) == 0 && v == 1024);
	CHECK(fm_parse_bytes("", &v) == -EINVAL);
	CHECK(fm_parse_bytes("-1M", &v) == -EINVAL);
	CHECK(fm_parse_bytes("12Q", &v) == -EINVAL);
	CHECK(fm_parse_bytes("1M2", &v) == -EINVAL);
	CHECK(fm_parse_bytes("99999999999999999999", &v) == -EINVAL);
	CHECK(fm_parse_bytes("20000000000T", &v) == -EINVAL); /* overflows on shift */
	CHECK(fm_parse_u64("7", 1, 10, &v) == 0 && v == 7);
	CHECK(fm_parse_u64("11", 1, 10, &v) == -ERANGE);
	CHECK(fm_parse_u64("x", 1, 10, &v) == -EINVAL);
	CHECK(fm_parse_u64(" 3", 1, 10, &v) == -EINVAL);
}

static void test_knobs(void)
{
	struct fm_pager_cfg c;
	char err[256];

	fm_pager_cfg_defaults(&c);
	CHECK(fm_pager_cfg_set(&c, "local", "25%", err, sizeof(err)) == 0 && c.local_pct == 25 && c.local_bytes == 0);
	CHECK(fm_pager_cfg_set(&c, "local", "64M", err, sizeof(err)) == 0 && c.local_bytes == 64ull << 20 && c.local_pct == 0);
	CHECK(fm_pager_cfg_set(&c, "local", "150%", err, sizeof(err)) == -EINVAL && strstr(err, "150%"));
	CHECK(fm_pager_cfg_set(&c, "local", "12", err, sizeof(err)) == -EINVAL);
	CHECK(fm_pager_cfg_set(&c, "fill_threads", "0", err, sizeof(err)) == -EINVAL && strstr(err, "fill_threads"));
	CHECK(fm_pager_cfg_set(&c, "prefetch", "16", err, sizeof(err)) == 0 && c.prefetch == 16);
	CHECK(fm_pager_cfg_set(&c, "transport", "rdma", err, sizeof(err)) == -EINVAL);
	CHECK(fm_pager_cfg_set(&c, "transport", "stream", err, sizeof(err)) == 0);
	CHECK(fm_pager_cfg_set(&c, "bogus", "1", err, sizeof(err)) == -ENOENT && strstr(err, "bogus"));
	/* knobs.h: a percentage takes its '%', an agent option lists memds with ';', discard is the agent's */
	CHECK(fm_pager_cfg_set(&c, "evict_high", "90%", err, sizeof(err)) == 0 && c.evict_high == 90);
	CHECK(fm_pager_cfg_set(&c, "memd", "unix:/a;tcp:h:1", err, sizeof(err)) == 0 && !strcmp(c.memd, "unix:/a,tcp:h:1"));
	CHECK(fm_pager_cfg_set(&c, "discard", "1", err, sizeof(err)) == -ENOENT);
	fm_pager_cfg_defaults(&c);
	CHECK(c.fill_threads == 2 && c.local_pct == 25 && c.threshold == 64ull << 20 && c.log_level == FM_LOG_WARN &&
	      c.memd_copy == 1 && c.memd_timeout_ms == 0 && c.xport_pref == 0 && c.gc_aware == 1 && !c.memd[0]);

	setenv("FARMEM_EVICT_HIGH", "80", 1);
	setenv("FARMEM_EVICT_LOW", "85", 1);
	CHECK(fm_pager_cfg_from_env(&c, err, sizeof(err)) == -EINVAL && strstr(err, "EVICT_LOW"));
	setenv("FARMEM_EVICT_LOW", "70", 1);
	setenv("FARMEM_PREFETCH", "lots", 1);
	CHECK(fm_pager_cfg_from_env(&c, err, sizeof(err)) == -EINVAL && strstr(err, "FARMEM_PREFETCH"));
	unsetenv("FARMEM_PREFETCH");
	CHECK(fm_pager_cfg_from_env(&c, err, sizeof(err)) == 0 && c.evict_high == 80 && c.evict_low == 70);
	unsetenv("FARMEM_EVICT_HIGH");
	unsetenv("FARMEM_EVICT_LOW");
}

static void test_crc(void)
{
	static const char v[] = "123456789";
	uint8_t page[4096];
	CHECK(fm_crc32c(v, 9) == 0xe3069283u);
	memset(page, 0, sizeof(page));
	uint32_t z = fm_crc32c(page, sizeof(page));
	page[4095] ^= 1;
	CHECK(fm_crc32c(page, sizeof(page)) != z);
}

static void test_hist(void)
{
	/* Buckets are monotonic, and a value falls in [floor(b), floor(b+1)). */
	unsigned prev = 0;
	for (uint64_t ns = 1; ns < (1ull << 33); ns = ns * 9 / 8 + 1) {
		unsigned b = fm_lat_bucket(ns);
		CHECK(b >= prev);
		prev = b;
		if (b + 1 < FM_LAT_BUCKETS) {
			CHECK(fm_lat_bucket_floor(b) <= ns);
			CHECK(ns < fm_lat_bucket_floor(b + 1));
		}
	}
	CHECK(fm_lat_bucket(~0ull) == FM_LAT_BUCKETS - 1);
}

static void test_auth(void)
{
	uint8_t sn[FM_NONCE_LEN], cn[FM_NONCE_LEN], a[FM_MAC_LEN], b[FM_MAC_LEN], c[FM_MAC_LEN];
	memset(sn, 1, sizeof(sn));
	memset(cn, 2, sizeof(cn));
	fm_auth_client_mac("secret", 6, sn, cn, a);
	fm_auth_client_mac("secret", 6, sn, cn, b);
	CHECK(fm_auth_mac_equal(a, b));
	fm_auth_client_mac("secreT", 6, sn, cn, b);
	CHECK(!fm_auth_mac_equal(a, b));
	/* The server's proof differs from the client's: a reflected MAC is useless. */
	fm_auth_server_mac("secret", 6, sn, cn, c);
	CHECK(!fm_auth_mac_equal(a, c));
}

static int hex_is(const uint8_t *mac, const char *hex)
{
	char got[2 * FM_MAC_LEN + 1];
	for (unsigned i = 0; i < FM_MAC_LEN; i++)
		snprintf(got + 2 * i, 3, "%02x", mac[i]);
	return strcmp(got, hex) == 0;
}

/* RFC 4231, test cases 1 and 6 (a key longer than SHA-256's block). */
static void test_hmac(void)
{
	uint8_t key[131], mac[FM_MAC_LEN];
	const char *long_msg = "Test Using Larger Than Block-Size Key - Hash Key First";

	memset(key, 0x0b, 20);
	CHECK(fm_hmac_sha256(key, 20, "Hi There", 8, mac) == 0);
	CHECK(hex_is(mac, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"));
	memset(key, 0xaa, sizeof(key));
	CHECK(fm_hmac_sha256(key, sizeof(key), long_msg, strlen(long_msg), mac) == 0);
	CHECK(hex_is(mac, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
}

/* fm_fmt must print what snprintf prints for every conversion farmem's messages use. */
static void same_as_snprintf(size_t cap, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void same_as_snprintf(size_t cap, const char *fmt, ...)
{
	char want[256], got[256];
	va_list ap, aq;
	int nw, ng;

	va_start(ap, fmt);
	va_copy(aq, ap);
	nw = vsnprintf(want, cap, fmt, ap);
	ng = fm_vfmt(got, cap, fmt, aq);
	va_end(aq);
	va_end(ap);
	if (nw != ng || strcmp(want, got)) {
		fprintf(stderr, "fm_fmt(\"%s\"): \"%s\" (%d), snprintf: \"%s\" (%d)\n", fmt, got, ng, want, nw);
		failures++;
	}
}

static void test_fmt(void)
{
	int x = 0;

	same_as_snprintf(256, "plain %% text");
	same_as_snprintf(256, "%s|%10s|%-10s|%.3s|%c", "memd", "right", "left", "truncated", 'z');
	same_as_snprintf(256, "%d %d %d %i %+d % d", 0, -7, INT_MIN, INT_MAX, 5, 5);
	same_as_snprintf(256, "%u %lu %llu %zu", 0u, ULONG_MAX, ULLONG_MAX, (size_t)12345);
	same_as_snprintf(256, "%x %X %#x %#lx %#llx %016llx %o", 0xbeefu, 0xbeefu, 0u, 0x7f00dead0000ul,
			 0xffffull, 0x1234ull, 8u);
	same_as_snprintf(256, "%5d|%-5d|%05d|%05x|%*d|%.*s", 42, 42, -42, 0xab, 6, 9, 2, "abc");
	same_as_snprintf(256, "%p %p", (void *)&x, (void *)NULL);
	same_as_snprintf(256, "%hhu %hu %ld %lld", (unsigned char)200, (unsigned short)60000, -1L, -1LL);
	/* cut short: the return says how long it would have been, the buffer ends in a NUL */
	same_as_snprintf(8, "lost memd at %s (%d)", "10.99.1.2:7070", 110);
	same_as_snprintf(1, "%s", "x");
}

static void test_memory_cgroup(void)
{
	char v1[] = "9:name=systemd:/\n4:memory:/process_api/6d03\n0::/\n";
	char v2[] = "0::/user.slice/user-0.slice/session-3.scope\n";
	char joined[] = "5:cpu,memory,pids:/a/b\n0::/\n";
	char last[] = "5:cpu,memory:/c\n";
	char none[] = "1:cpu:/\n2:memoryx:/x\n";
	char out[64], tiny[4];

	CHECK(fm_memory_cgroup(v1, out, sizeof(out)) == 0 && !strcmp(out, "/process_api/6d03"));
	CHECK(fm_memory_cgroup(v2, out, sizeof(out)) == 0 && !strcmp(out, "/user.slice/user-0.slice/session-3.scope"));
	CHECK(fm_memory_cgroup(joined, out, sizeof(out)) == 0 && !strcmp(out, "/a/b"));
	CHECK(fm_memory_cgroup(last, out, sizeof(out)) == 0 && !strcmp(out, "/c"));
	CHECK(fm_memory_cgroup(none, out, sizeof(out)) == -1);
	strcpy(v2, "0::/user.slice\n");
	CHECK(fm_memory_cgroup(v2, tiny, sizeof(tiny)) == -1);
}

static void test_page_bytes(void)
{
	CHECK(fm_pg_is_remote(FM_PG_REMOTE | FM_PGF_HAS_REMOTE));
	CHECK(fm_pg_is_remote(FM_PG_FILLING));
	CHECK(!fm_pg_is_remote(FM_PG_UNTOUCHED));
	CHECK(fm_pg_is_resident(FM_PG_DIRTY | FM_PGF_REF));
	CHECK(!fm_pg_is_resident(FM_PG_REMOTE));
	CHECK(fm_pg_state(FM_PG_LEAVING | FM_PGF_GARBAGE | FM_PGF_GC) == FM_PG_LEAVING);
}

/* farmem's descriptors: moved up, known by their file, let go when the program put its own there. */
static void test_fds(void)
{
	int fd = fm_fd_keep(eventfd(0, EFD_CLOEXEC)), mine;

	CHECK(fd >= 64 && fd < FM_FDS_MAX); /* out of the numbers a script picks (half the limit, at most 512) */
	CHECK(fcntl(fd, F_GETFD) == FD_CLOEXEC);
	CHECK(fm_fd_owned(fd) && !fm_fd_owned(0));
	mine = open("/dev/null", O_RDONLY);
	CHECK(mine >= 0 && dup2(mine, fd) == fd); /* the program's file on farmem's number */
	CHECK(!fm_fd_owned(fd));
	CHECK(fm_fd_close(fd) == -1 && errno == EBADF && fcntl(fd, F_GETFD) >= 0); /* not farmem's to close */
	close(fd);
	close(mine);
	fd = fm_fd_keep(eventfd(0, EFD_CLOEXEC));
	CHECK(fm_fd_close(fd) == 0 && fcntl(fd, F_GETFD) == -1 && !fm_fd_owned(fd));
}

static long fd_table_size(void)
{
	char line[256];
	long size = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "FDSize:", 7))
			size = strtol(line + 7, NULL, 10);
	if (f)
		fclose(f);
	return size;
}

/*
 * The table grown to hold farmem's numbers (at most 512: half the limit), and
 * nothing left open there; in a child, whose table fork sized to the
 * descriptors open, so that it starts no larger than those need.
 */
static void test_fds_widen(void)
{
	struct rlimit nofile;
	long base = 512;
	int status = -1;
	pid_t pid;

	if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur != RLIM_INFINITY && (long)nofile.rlim_cur / 2 < base)
		base = (long)nofile.rlim_cur / 2;
	pid = fork();
	if (pid == 0) {
		long before = fd_table_size(), after;
		int ok, fd;

		fm_fds_widen();
		after = fd_table_size();
		/* The number that grew it is free again. */
		ok = before > 0 && before <= base && after > base && fcntl((int)base, F_GETFD) == -1;
		/* farmem's next descriptor lands in the grown table. */
		fd = fm_fd_keep(eventfd(0, EFD_CLOEXEC));
		ok = ok && fd >= base && fd < after && fm_fd_close(fd) == 0;
		if (!ok)
			fprintf(stderr, "fd table %ld -> %ld entries, base %ld, fd %d\n", before, after, base, fd);
		_exit(ok ? 0 : 1);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
	test_units();
	test_knobs();
	test_crc();
	test_hist();
	test_auth();
	test_hmac();
	test_fmt();
	test_memory_cgroup();
	test_page_bytes();
	test_fds_widen();
	test_fds();
	if (failures) {
		fprintf(stderr, "test_core: %d checks failed\n", failures);
		return 1;
	}
	printf("test_core: ok\n");
	return 0;
}
