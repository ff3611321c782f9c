/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lockcost: what the shim's cover of pthread_mutex_lock costs a program
 * whose locks are not in paged memory (uffd/preload_sync.c). THREADS threads
 * each take and release one mutex in the program's data N times; a 128 MiB
 * mapping, touched for 1 MiB, starts the pager so that the covers are live.
 * Prints nanoseconds per lock and unlock. Run it under `farmem run` with two
 * builds of the shim, and without farmem, side by side:
 *
 *   farmem run --local 64M -- build/bench/lockcost [THREADS] [N]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long rounds = 50000000, shared;

static void *run(void *arg)
{
	for (long i = 0; i < rounds; i++) {
		pthread_mutex_lock(&lock);
		shared++;
		pthread_mutex_unlock(&lock);
	}
	return arg;
}

int main(int argc, char **argv)
{
	int threads = argc > 1 ? atoi(argv[1]) : 1;
	pthread_t th[64];
	struct timespec t0, t1;
	char *paged;
	double ns;

	if (argc > 2)
		rounds = atol(argv[2]);
	if (threads < 1 || threads > 64 || rounds < 1) {
		fprintf(stderr, "usage: lockcost [THREADS 1-64] [N]\n");
		return 2;
	}
	paged = mmap(NULL, 128 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (paged == MAP_FAILED) {
		perror("lockcost: mmap");
		return 1;
	}
	memset(paged, 1, 1 << 20);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int k = 0; k < threads; k++)
		pthread_create(&th[k], NULL, run, NULL);
	for (int k = 0; k < threads; k++)
		pthread_join(th[k], NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / ((double)rounds * threads);
	printf("lockcost: %d threads: %.1f ns per lock and unlock\n", threads, ns);
	return shared != rounds * threads;
}
