// SPDX-License-Identifier: Apache-2.0
/*
 * move_remote: what fm_pager_move costs for pages that live in memd (issue
 * 7), over the stream transport on TCP: a private memd on 127.0.0.1, a
 * pager in this process, N pages written and pushed out until every one is
 * remote, then moved back and forth between two ranges of one region. Each
 * move keeps them remote, either by memd copying each page slot to slot
 * (COPY, memd_copy=1) or by the pager reading it and writing it back
 * (memd_copy=0, what it did before COPY, and still does with an older memd).
 *
 * Reported per configuration: time per remote page (median move), and the
 * bytes on the wire per remote page: TCP payload both ways, summed over
 * this process's connections to memd (TCP_INFO's bytes_acked and
 * bytes_received), so protocol headers and every request count. The two
 * configurations alternate, ROUNDS times, and the ratio of each round's pair
 * is reported too (the machine may be shared). Every byte is checked at the end.
 *
 *   move_remote [PAGES [MOVES [ROUNDS]]]     (defaults 4096 8 3; run from the repository root)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/tcp.h>

#include "memd_spawn.h"
#include "pager.h"
#include "resmap.h"

#define PG 4096ul
#define SPARE 4096ul  /* pages touched to push the moved ones out (16 MiB, 4x the budget) */

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static uint64_t word(uint64_t page, unsigned k)
{
	uint64_t x = (page << 20) ^ k ^ 0x2545f4914f6cdd1dull;
	x ^= x >> 31;
	x *= 0x9e3779b97f4a7c15ull;
	return x ^ (x >> 29);
}

/* TCP payload bytes sent (and acknowledged) plus received on our connections to port. */
static uint64_t wire_bytes(int port)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	uint64_t sum = 0;

	while (d && (e = readdir(d))) {
		int fd = atoi(e->d_name);
		struct sockaddr_in peer;
		socklen_t pl = sizeof(peer);
		struct tcp_info ti;
		socklen_t tl = sizeof(ti);

		if (e->d_name[0] == '.' || fd == dirfd(d))
			continue;
		if (getpeername(fd, (struct sockaddr *)&peer, &pl) || peer.sin_family != AF_INET ||
		    ntohs(peer.sin_port) != port)
			continue;
		memset(&ti, 0, sizeof(ti));
		if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0)
			sum += ti.tcpi_bytes_acked + ti.tcpi_bytes_received;
	}
	if (d)
		closedir(d);
	return sum;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct result {
	double us_per_page;       /* median move */
	double wire_per_page;     /* bytes, all moves */
	uint64_t remote, fetched, reads, writes, copied, calls, pages_moved_resident;
};

static int run(const char *addr, int port, unsigned long n, int moves, int copy, struct result *res)
{
	struct fm_pager_cfg cfg;
	struct fm_pager *p = NULL;
	struct fm_resmap_hdr *h;
	char err[512];
	unsigned long npages = 2 * n + SPARE;
	uint8_t *a, *from, *to;
	double t[64];
	uint64_t w0, r0, fe0, rd0, wr0, cp0, cl0, mv0, bad = 0;
	int rc = 1;

	fm_pager_cfg_defaults(&cfg);
	if (fm_pager_cfg_set(&cfg, "memd", addr, err, sizeof(err)) ||
	    fm_pager_cfg_set(&cfg, "secret", UNIT_MEMD_SECRET, err, sizeof(err)) ||
	    fm_pager_cfg_set(&cfg, "transport", "stream", err, sizeof(err)) ||
	    fm_pager_cfg_set(&cfg, "local", "4M", err, sizeof(err)) ||
	    fm_pager_cfg_set(&cfg, "prefetch", "0", err, sizeof(err)) ||
	    fm_pager_cfg_set(&cfg, "memd_copy", copy ? "1" : "0", err, sizeof(err)) ||
	    fm_pager_start(&cfg, &p, err, sizeof(err))) {
		fprintf(stderr, "move_remote: %s\n", err);
		return 1;
	}
	h = fm_pager_map(p);
	a = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED || fm_pager_register(p, a, npages * PG, FM_REG_HEAP)) {
		fprintf(stderr, "move_remote: cannot register %lu pages\n", npages);
		goto out;
	}
	for (unsigned long i = 0; i < n; i++)
		for (unsigned k = 0; k < PG / 8; k++)
			((uint64_t *)(a + i * PG))[k] = word(i, k);
	/* Push every page out: write the spare pages until the clock has passed them all. */
	for (int round = 0; round < 60; round++) {
		const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;
		unsigned long remote = 0;
		for (unsigned long i = 0; i < n; i++)
			remote += (map[i] & FM_PG_STATE_MASK) == FM_PG_REMOTE;
		if (remote == n)
			break;
		for (unsigned long i = 2 * n; i < npages; i++)
			a[i * PG + (unsigned)round % PG] = (uint8_t)round;
	}
	usleep(200 * 1000); /* let the evictor settle: its writes are not the move's */

	w0 = wire_bytes(port);
	r0 = h->stats.swapva_pages_remote;
	fe0 = h->stats.swapva_pages_fetched;
	rd0 = h->stats.remote_reads;
	wr0 = h->stats.remote_writes;
	cp0 = h->stats.swapva_remote_copied;
	cl0 = h->stats.swapva_copy_calls;
	mv0 = h->stats.swapva_pages_moved;
	from = a;
	to = a + n * PG;
	for (int m = 0; m < moves; m++) {
		uint64_t before = h->stats.swapva_pages_remote;
		double t0 = now_us();
		uint8_t *x;

		if (fm_pager_move(p, to, from, n * PG)) {
			fprintf(stderr, "move_remote: fm_pager_move failed\n");
			goto out;
		}
		t[m] = (now_us() - t0) / (double)(h->stats.swapva_pages_remote - before ? h->stats.swapva_pages_remote - before : 1);
		x = from;
		from = to;
		to = x;
	}
	res->wire_per_page = (double)(wire_bytes(port) - w0);
	res->remote = h->stats.swapva_pages_remote - r0;
	res->fetched = h->stats.swapva_pages_fetched - fe0;
	res->reads = h->stats.remote_reads - rd0;
	res->writes = h->stats.remote_writes - wr0;
	res->copied = h->stats.swapva_remote_copied - cp0;
	res->calls = h->stats.swapva_copy_calls - cl0;
	res->pages_moved_resident = h->stats.swapva_pages_moved - mv0;
	res->wire_per_page /= (double)(res->remote ? res->remote : 1);
	qsort(t, (size_t)moves, sizeof(t[0]), cmp_double);
	res->us_per_page = t[moves / 2];
	/* Every byte where it should be: the pages now live at `from`. */
	for (unsigned long i = 0; i < n; i++)
		for (unsigned k = 0; k < PG / 8; k++)
			bad += ((uint64_t *)(from + i * PG))[k] != word(i, k);
	if (bad) {
		fprintf(stderr, "move_remote: %llu words wrong after the moves\n", (unsigned long long)bad);
		goto out;
	}
	rc = 0;
out:
	fm_pager_stop(p);
	if (a != MAP_FAILED)
		munmap(a, npages * PG);
	return rc;
}

int main(int argc, char **argv)
{
	unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 0) : 4096;
	int moves = argc > 2 ? atoi(argv[2]) : 8, rounds = argc > 3 ? atoi(argv[3]) : 3;
	char addr[64], sock[64];
	struct result r[2][16];
	int port, st, rc = 0;
	pid_t memd;

	if (n < 256 || moves < 1 || moves > 64 || rounds < 1 || rounds > 16) {
		fprintf(stderr, "usage: move_remote [PAGES>=256 [MOVES 1..64 [ROUNDS 1..16]]]\n");
		return 2;
	}
	/* memd listens on a Unix socket too; only its TCP address (a port the kernel picked) is used. */
	snprintf(sock, sizeof(sock), "/tmp/move_remote-%d.sock", getpid());
	memd = unit_start_memd_ex(sock, "1G", addr, sizeof(addr));
	if (memd < 0)
		return 1;
	port = atoi(strrchr(addr, ':') + 1);
	for (int k = 0; k < rounds && !rc; k++)
		for (int copy = 0; copy < 2 && !rc; copy++)
			rc = run(addr, port, n, moves, copy, &r[copy][k]);
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	{
		char logpath[80];
		snprintf(logpath, sizeof(logpath), "%s.log", sock);
		unlink(logpath);
		unlink(sock);
	}
	if (rc)
		return rc;
	printf("move_remote: %lu pages moved %d times per run over TCP (%s), %d runs each\n", n, moves, addr, rounds);
	for (int copy = 0; copy < 2; copy++) {
		double us[16], wire[16];
		struct result *x = &r[copy][rounds - 1];

		for (int k = 0; k < rounds; k++) {
			us[k] = r[copy][k].us_per_page;
			wire[k] = r[copy][k].wire_per_page;
		}
		qsort(us, (size_t)rounds, sizeof(us[0]), cmp_double);
		qsort(wire, (size_t)rounds, sizeof(wire[0]), cmp_double);
		printf("%-22s %8.2f us/page (runs %.2f..%.2f)  %8.1f wire bytes/page  "
		       "[last run: remote %llu, fetched %llu, resident moved %llu, reads %llu, writes %llu, "
		       "copied in memd %llu in %llu calls]\n",
		       copy ? "copy (memd_copy=1)" : "read+write (memd_copy=0)", us[rounds / 2], us[0],
		       us[rounds - 1], wire[rounds / 2], (unsigned long long)x->remote,
		       (unsigned long long)x->fetched, (unsigned long long)x->pages_moved_resident,
		       (unsigned long long)x->reads, (unsigned long long)x->writes,
		       (unsigned long long)x->copied, (unsigned long long)x->calls);
	}
	{
		/* The two ran next to each other in each round: their ratio is the steadiest figure here. */
		double ratio[16];

		for (int k = 0; k < rounds; k++)
			ratio[k] = r[0][k].us_per_page / r[1][k].us_per_page;
		qsort(ratio, (size_t)rounds, sizeof(ratio[0]), cmp_double);
		printf("read+write / copy, time per page, paired by round: median %.2fx (%.2f..%.2f)\n",
		       ratio[rounds / 2], ratio[0], ratio[rounds - 1]);
	}
	return 0;
}
