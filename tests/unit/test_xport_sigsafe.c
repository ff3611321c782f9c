// SPDX-License-Identifier: Apache-2.0
/*
 * The transports' data path in a signal handler (transport.h, "Signal
 * safety"): the pager resolves a fault in the faulting thread's SIGBUS
 * handler, which interrupts the program wherever it is, inside malloc or
 * stdio included. Here a thread that does nothing but allocate, free and
 * format into a FILE is interrupted thousands of times, and its handler
 * writes a page, reads it back and discards pages through each transport:
 * shm, stream, and two memds with R=2, one of them killed halfway so that
 * failover, the loss message and its accounting run in the handler too; then
 * the stream transport's memd goes as well, for its error path. A data path
 * that allocated, used stdio or took a lock its own thread could hold would,
 * sooner or later, deadlock here: a handler that does not return within
 * HANDLER_WAIT_S fails the test.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"
#include "transport.h"
#include "unit.h"
#include "unit_xport.h"

#define NPAGES 64
#define ROUNDS 1500
#define HANDLER_WAIT_S 20

struct target {
	const char *name;
	struct fm_xport *x;
	struct fm_chan *c;
	uint32_t space;
	int expect_ok;              /* 0 once its memd is gone: calls must fail, not hang */
};

static struct target *cur;
static atomic_uint handled, bad;
static uint32_t version[NPAGES];
static uint8_t page[4096] __attribute__((aligned(4096)));
static atomic_int stop;

/* Everything here must be signal-safe: no CHECK (it prints), only counters. */
static void on_signal(int sig)
{
	static unsigned n;
	uint64_t p = n % NPAGES;
	const void *data = page, *src;
	uint32_t st;
	int rc;

	n++;
	write_page(page, 0, version[p] + 1);
	rc = fm_chan_write(cur->c, cur->space, &p, 1, &data, &st);
	if (cur->expect_ok) {
		if (rc || st != FM_OK)
			atomic_fetch_add(&bad, 1);
		else
			version[p]++;
		rc = fm_chan_read(cur->c, cur->space, &p, 1, &src);
		if (rc || !page_ok(src, 0, version[p]))
			atomic_fetch_add(&bad, 1);
		if (n % 8 == 0) {
			struct fm_range r = { .first = (p + 1) % NPAGES, .npages = 1 };
			if (fm_chan_discard(cur->c, cur->space, &r, 1))
				atomic_fetch_add(&bad, 1);
			version[r.first] = 0;
		}
	} else {
		const void *s2;
		(void)fm_chan_read(cur->c, cur->space, &p, 1, &s2);
	}
	atomic_fetch_add(&handled, 1);
}

/* The program the handler interrupts: allocation and stdio, nothing else. */
static void *churn(void *arg)
{
	FILE *f = fopen("/dev/null", "w");
	unsigned k = 0;

	while (!atomic_load(&stop)) {
		size_t len = 16 + (k * 7919) % 70000;
		char *b = malloc(len), *c = calloc(1, 64);
		char line[128];
		if (b)
			b[len - 1] = (char)k;
		snprintf(line, sizeof(line), "%u %s %f", k, "churn", k / 3.0);
		fputs(line, f);
		fprintf(f, "%zu\n", len);
		free(c);
		free(b);
		k++;
	}
	fclose(f);
	return NULL;
}

/* Interrupt the churning thread rounds times, one signal at a time; a handler that blocks ends the test. */
static int hammer(pthread_t t, struct target *tg, unsigned rounds)
{
	cur = tg;
	for (unsigned i = 0; i < rounds; i++) {
		unsigned before = atomic_load(&handled);
		time_t t0 = time(NULL);
		pthread_kill(t, SIGUSR1);
		while (atomic_load(&handled) == before) {
			struct timespec ts = { 0, 100000 };
			if (time(NULL) - t0 > HANDLER_WAIT_S) {
				fprintf(stderr, "%s: a handler did not return in %d s: the data path blocked in a signal handler\n",
					tg->name, HANDLER_WAIT_S);
				_exit(1);  /* the blocked thread cannot be joined; the memds die with us */
			}
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

static int setup(struct target *tg, const char *name, const char *addr, int pref, int replicas)
{
	struct unit_xport u;

	tg->name = name;
	tg->expect_ok = 1;
	if (unit_xport_open(&u, name, addr, pref, 500, replicas, NPAGES, NULL))
		return -1;
	tg->x = u.x;
	tg->c = u.c;
	tg->space = u.space;
	memset(version, 0, sizeof(version));
	return 0;
}

static void teardown(struct target *tg)
{
	fm_chan_close(tg->c);
	fm_xport_close(tg->x);
}

/*
 * shm's kept free space: a release gives back the slots memd does not hold and
 * leaves one written again since it was kept (its forget still to come) with
 * its bytes.
 */
static void release_keeps_written(struct target *tg)
{
	uint64_t pages[8];
	const void *data[8], *src;
	uint32_t st[8];
	struct fm_range all = { .first = 8, .npages = 8 };
	uint64_t again = 11;
	int kept = 0;

	for (unsigned k = 0; k < 8; k++) {
		pages[k] = 8 + k;
		data[k] = page;
	}
	uint64_t kept0 = fm_xport_kept_pages(tg->x);
	write_page(page, 0, 41);
	CHECK(fm_chan_write(tg->c, tg->space, pages, 8, data, st) == 0);
	CHECK(fm_xport_kept_pages(tg->x) == kept0);
	CHECK(fm_chan_forget(tg->c, tg->space, &all, 1, &kept) == 0 && kept);
	CHECK(fm_xport_kept_pages(tg->x) == kept0 + 8);
	/* Forgetting what is forgotten already keeps nothing more: the count is of slots. */
	CHECK(fm_chan_forget(tg->c, tg->space, &all, 1, &kept) == 0);
	CHECK(fm_xport_kept_pages(tg->x) == kept0 + 8);
	write_page(page, 0, 42);
	CHECK(fm_chan_write(tg->c, tg->space, &again, 1, data, st) == 0 && st[0] == FM_OK);
	CHECK(fm_xport_kept_pages(tg->x) == kept0 + 7);
	CHECK(fm_chan_release(tg->c, tg->space, &all, 1) == 0);
	CHECK(fm_xport_kept_pages(tg->x) == kept0);
	CHECK(fm_chan_read(tg->c, tg->space, &again, 1, &src) == 0 && page_ok(src, 0, 42));
	CHECK(fm_chan_read(tg->c, tg->space, &pages[0], 1, &src) == -ENOENT);
}

/* Pages pg and pg + 1 emptied of the hammer's copies, then pg written with version v. */
static void two_pages(struct target *tg, uint64_t pg, uint32_t v)
{
	const void *data[1] = { page };
	uint32_t st[1];
	struct fm_range both = { .first = pg, .npages = 2 };

	CHECK(fm_chan_discard(tg->c, tg->space, &both, 1) == 0);
	write_page(page, 0, v);
	CHECK(fm_chan_write(tg->c, tg->space, &pg, 1, data, st) == 0 && st[0] == FM_OK);
}

/*
 * shm's pages opened in place: a page opened to be overwritten whole is
 * neither checked nor zeroed (its old bytes are dead), one opened to be
 * changed is checked, and a new one is zeros.
 */
static void open_in_place(struct target *tg)
{
	uint64_t pg = 20, fresh = 21;
	const void *src;
	uint8_t *b;

	two_pages(tg, pg, 51);
	CHECK(fm_chan_page_open(tg->c, tg->space, pg, 0, &b) == 0 && page_ok(b, 0, 51));
	b[100] ^= 1; /* damaged behind the checksum's back */
	CHECK(fm_chan_page_open(tg->c, tg->space, pg, 0, &b) == -EIO);
	CHECK(fm_chan_page_open(tg->c, tg->space, pg, FM_PAGE_OVERWRITE, &b) == 0);
	write_page(b, 0, 52);
	CHECK(fm_chan_page_seal(tg->c, tg->space, pg) == 0);
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == 0 && page_ok(src, 0, 52));
	CHECK(fm_chan_page_open(tg->c, tg->space, fresh, 0, &b) == -ENOENT);
	CHECK(fm_chan_page_open(tg->c, tg->space, fresh, FM_PAGE_CREATE, &b) == 0);
	CHECK(b[0] == 0 && b[4095] == 0);
	CHECK(fm_chan_page_seal(tg->c, tg->space, fresh) == 0);
	CHECK(fm_chan_read(tg->c, tg->space, &fresh, 1, &src) == 0 && ((const uint8_t *)src)[17] == 0);
}

/*
 * shm's checks in a pause (fm_xport_pause): a page checked once in a pause is
 * not checked again until it ends, so bytes damaged after that check pass
 * within the pause and are found by the first read after it, and by the
 * first read of the next pause; a copy's destination is checked at its
 * first read.
 */
static void checked_once_a_pause(struct target *tg)
{
	uint64_t pg = 30, dst = 31;
	const void *src;
	uint32_t st[1];
	uint8_t *b;

	two_pages(tg, pg, 61);
	/* The store's bytes, to damage: an open to overwrite neither checks nor marks them. */
	CHECK(fm_chan_page_open(tg->c, tg->space, pg, FM_PAGE_OVERWRITE, &b) == 0);

	b[100] ^= 1;
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == -EIO); /* outside a pause: every read */
	b[100] ^= 1;

	fm_xport_pause(tg->x, 1);
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == 0 && page_ok(src, 0, 61));
	b[100] ^= 1;
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == 0);  /* checked in this pause already */
	CHECK(fm_chan_page_open(tg->c, tg->space, pg, 0, &b) == 0);
	fm_xport_pause(tg->x, 1);
	fm_xport_pause(tg->x, 0);                                   /* nested: still the same pause */
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == 0);
	fm_xport_pause(tg->x, 0);
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == -EIO); /* found once the pause ends */
	fm_xport_pause(tg->x, 1);
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == -EIO); /* and at the next one's first read */
	CHECK(fm_chan_page_open(tg->c, tg->space, pg, 0, &b) == -EIO);
	b[100] ^= 1;
	CHECK(fm_chan_read(tg->c, tg->space, &pg, 1, &src) == 0 && page_ok(src, 0, 61));

	/* A copy's destination holds bytes nobody checked there: its first read checks them. */
	CHECK(fm_chan_copy(tg->c, tg->space, &pg, tg->space, &dst, 1, st) == 0 && st[0] == FM_OK);
	CHECK(fm_chan_page_open(tg->c, tg->space, dst, FM_PAGE_OVERWRITE, &b) == 0);
	b[200] ^= 1;
	CHECK(fm_chan_read(tg->c, tg->space, &dst, 1, &src) == -EIO);
	b[200] ^= 1;
	CHECK(fm_chan_read(tg->c, tg->space, &dst, 1, &src) == 0 && page_ok(src, 0, 61));
	fm_xport_pause(tg->x, 0);
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_signal };
	struct unit_two_memds md;
	char unix_a[96];
	struct target shm, stream, multi;
	pid_t a, b;
	pthread_t t;

	fm_log_level = FM_LOG_ERROR;  /* the losses below are meant; their messages still run */
	if (unit_start_two_memds(&md, "sigsafe", "64M", "64M"))
		return 1;
	a = md.pid[0];
	b = md.pid[1];
	snprintf(unix_a, sizeof(unix_a), "unix:%s", md.sock[0]);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	if (pthread_create(&t, NULL, churn, NULL))
		return 1;

	CHECK(setup(&shm, "shm", unix_a, FM_PREF_SHM, 0) == 0);
	CHECK(fm_xport_kind(shm.x) == FM_XPORT_SHM);
	CHECK(hammer(t, &shm, ROUNDS) == 0);
	release_keeps_written(&shm);
	open_in_place(&shm);
	checked_once_a_pause(&shm);
	teardown(&shm);

	CHECK(setup(&multi, "several memds", md.two, FM_PREF_AUTO, 2) == 0);
	CHECK(hammer(t, &multi, ROUNDS / 2) == 0);
	kill(b, SIGKILL);
	waitpid(b, NULL, 0);
	CHECK(hammer(t, &multi, ROUNDS / 2) == 0);  /* failover and the loss, in the handler */
	teardown(&multi);

	CHECK(setup(&stream, "stream", md.tcp[0], FM_PREF_STREAM, 0) == 0);
	CHECK(fm_xport_kind(stream.x) == FM_XPORT_STREAM);
	CHECK(hammer(t, &stream, ROUNDS) == 0);
	kill(a, SIGKILL);
	waitpid(a, NULL, 0);
	stream.expect_ok = 0;
	CHECK(hammer(t, &stream, 50) == 0);  /* memd gone: errors, reconnects, messages */
	teardown(&stream);

	atomic_store(&stop, 1);
	pthread_join(t, NULL);
	CHECK(atomic_load(&bad) == 0);
	if (failures) {
		fprintf(stderr, "test_xport_sigsafe: %d checks failed (%u bad data-path results)\n", failures,
			atomic_load(&bad));
		return 1;
	}
	unit_memd_files_remove(md.sock[0]);
	unit_memd_files_remove(md.sock[1]);
	printf("test_xport_sigsafe: ok (%u handlers, each a write, a read and every 8th a discard)\n",
	       atomic_load(&handled));
	return 0;
}
