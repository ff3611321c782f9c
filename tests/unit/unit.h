/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the pager's unit tests share: CHECK, the page pattern of the tests
 * that version pages, and (memd_spawn.h) a private farmem-memd on a Unix
 * socket with the unit secret, which dies with the test.
 */
#ifndef FARMEM_UNIT_H
#define FARMEM_UNIT_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memd_spawn.h"

static int failures;
#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

/* Word k of version v of page p (version 0: a zero page). */
static inline uint64_t page_word(uint64_t p, uint32_t v, unsigned k)
{
	uint64_t x = (p << 20) ^ ((uint64_t)v << 48) ^ k;

	x ^= x >> 31;
	x *= 0x9e3779b97f4a7c15ull;
	return x ^ (x >> 29);
}

static inline void write_page(uint8_t *base, uint64_t p, uint32_t v)
{
	uint64_t *w = (uint64_t *)(base + p * 4096);

	for (unsigned k = 0; k < 4096 / 8; k++)
		w[k] = page_word(p, v, k);
}

static inline int page_ok(const uint8_t *base, uint64_t p, uint32_t v)
{
	const uint64_t *w = (const uint64_t *)(base + p * 4096);

	for (unsigned k = 0; k < 4096 / 8; k++)
		if (w[k] != (v ? page_word(p, v, k) : 0))
			return 0;
	return 1;
}

static const char *unit_name;

static void unit_timed_out(int sig)
{
	static const char msg[] = ": timed out (a thread asleep on a fault nobody answered?)\n";

	(void)sig;
	if (write(2, unit_name, strlen(unit_name)) < 0 || write(2, msg, sizeof(msg) - 1) < 0)
		_exit(3);
	_exit(3);
}

/*
 * A test's main: a private memd (256 MiB), each(sock, fault) with faults served
 * in the faulting thread, then by handler threads, memd stopped and checked.
 * Returns the exit status, having said "NAME: ok" or how many checks failed.
 */
static inline int unit_main(const char *name, void (*each)(const char *sock, const char *fault))
{
	char sock[64];
	pid_t memd;
	int st;

	/* A lost wakeup hangs a test, not the whole run: fail it after ten minutes. */
	unit_name = name;
	signal(SIGALRM, unit_timed_out);
	alarm(600);
	snprintf(sock, sizeof(sock), "/tmp/farmem-unit-%d.sock", getpid());
	memd = unit_start_memd(sock, "256M");
	if (memd < 0)
		return 1;
	each(sock, "signal");
	each(sock, "thread");
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (failures) {
		fprintf(stderr, "%s: %d checks failed\n", name, failures);
		return 1;
	}
	printf("%s: ok\n", name);
	return 0;
}

#endif /* FARMEM_UNIT_H */
