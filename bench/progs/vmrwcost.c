// SPDX-License-Identifier: Apache-2.0
/*
 * What one process_vm_writev and process_vm_readv into another process's
 * memory cost: a child writes SIZE bytes CALLS times into its parent's
 * buffer of MIB MiB (a different page-aligned offset each time), then reads
 * them back the same way, and prints microseconds a call for each. Under
 * farmem with a budget that holds the buffer, nothing is evicted: what is
 * left is the cover's and the lender's own cost (uffd/lend.h).
 *
 *   vmrwcost MIB CALLS SIZE
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int calls_into(pid_t pid, char *local, char *remote, size_t len, size_t size, int calls, int write)
{
	double t0 = now_us();

	for (int i = 0; i < calls; i++) {
		size_t off = ((size_t)i * 4096 * 7) % (len - size);
		struct iovec l = { local, size }, r = { remote + off, size };
		ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
		if (n != (ssize_t)size) {
			perror(write ? "vmrwcost: process_vm_writev" : "vmrwcost: process_vm_readv");
			return 1;
		}
	}
	printf("vmrwcost: %s of %zu bytes: %.2f us a call\n", write ? "process_vm_writev" : "process_vm_readv", size,
	       (now_us() - t0) / calls);
	return 0;
}

int main(int argc, char **argv)
{
	size_t len, size;
	int calls, down[2], st;
	uint64_t where;
	char *buf;
	pid_t pid;

	if (argc != 4 || atoi(argv[1]) < 1 || atoi(argv[2]) < 1 || atoi(argv[3]) < 1) {
		fprintf(stderr, "usage: vmrwcost MIB CALLS SIZE\n");
		return 2;
	}
	len = (size_t)atoi(argv[1]) << 20;
	calls = atoi(argv[2]);
	size = (size_t)atoi(argv[3]);
	if (size >= len) {
		fprintf(stderr, "vmrwcost: SIZE must be below MIB MiB\n");
		return 2;
	}
	buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED || pipe(down)) {
		perror("vmrwcost");
		return 1;
	}
	memset(buf, 1, len);
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("vmrwcost: fork");
		return 1;
	}
	if (pid == 0) {
		char *src = malloc(size);
		int rc;
		if (!src || read(down[0], &where, sizeof(where)) != (ssize_t)sizeof(where))
			_exit(1);
		memset(src, 7, size);
		rc = calls_into(getppid(), src, (char *)(uintptr_t)where, len, size, calls, 1) ||
		     calls_into(getppid(), src, (char *)(uintptr_t)where, len, size, calls, 0);
		fflush(stdout);
		_exit(rc);
	}
	where = (uintptr_t)buf;
	if (write(down[1], &where, sizeof(where)) != (ssize_t)sizeof(where))
		return 1;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		return 1;
	/* The child wrote 7s over the parent's 1s: check a piece it wrote. */
	return buf[0] == 7 ? 0 : 1;
}
