// SPDX-License-Identifier: Apache-2.0
/*
 * What UFFD_FEATURE_EVENT_FORK gives a forked child, on the running kernel:
 * the facts docs/fork-design.md builds on. Not part of the build:
 *
 *   cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -o /tmp/probe tools/probes/uffd_fork_probe.c
 *
 * A parent registers eight pages (missing and write-protect, with SIGBUS,
 * UNMAP and REMOVE events), fills pages 0, 2 (write-protected), 3 and 4,
 * leaves page 1 a hole, and forks. Its reader thread takes the FORK event.
 * The child reads page 0, writes page 2, reads page 1, and then, after the
 * parent filled page 1 through the child's uffd, reads it again, unmaps
 * page 3 and MADV_DONTNEEDs page 4; the parent reads the child's uffd's
 * events only two seconds later. Linux 6.18 prints:
 *
 *   parent: FORK event, child's uffd 8
 *   parent: UFFDIO_API on the child's uffd: Invalid argument (features it reports 0)
 *   child: page0 'a'; write wp page2: SIGBUS; read hole page1: SIGBUS
 *   child: after the parent's UFFDIO_COPY through cfd: page1 read 'b'
 *   parent: child's uffd event UNMAP
 *   child: munmap of a registered page returned after 2.00 s
 *   child: MADV_DONTNEED returned after 2.00 s
 *   parent: child's uffd event REMOVE
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PG 4096
static char *area;
static int uffd, cfd = -1;
static sigjmp_buf jb;
static volatile sig_atomic_t bus;

static void on_bus(int s) { (void)s; bus++; siglongjmp(jb, 1); }

static void *reader(void *a)
{
	(void)a;
	for (;;) {
		struct pollfd p = { uffd, POLLIN, 0 };
		struct uffd_msg m;
		poll(&p, 1, -1);
		if (read(uffd, &m, sizeof(m)) != sizeof(m))
			continue;
		if (m.event == UFFD_EVENT_FORK) {
			cfd = (int)m.arg.fork.ufd;
			printf("parent: FORK event, child's uffd %d\n", cfd);
			fflush(stdout);
			return NULL;
		}
		printf("parent: event %u\n", m.event);
	}
}

static void copy(int fd, int page, char v, int wp)
{
	static char buf[PG] __attribute__((aligned(PG)));
	struct uffdio_copy c = { .dst = (unsigned long)(area + page * PG), .src = (unsigned long)buf, .len = PG,
				 .mode = wp ? UFFDIO_COPY_MODE_WP : 0 };
	memset(buf, v, PG);
	if (ioctl(fd, UFFDIO_COPY, &c))
		printf("UFFDIO_COPY page %d on fd %d: %s\n", page, fd, strerror(errno));
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void)
{
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_SIGBUS |
				  UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	int to_parent[2], to_child[2];
	pthread_t t;
	pid_t pid;
	char c;

	uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("uffd");
		return 1;
	}
	area = mmap(NULL, 8 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct uffdio_register reg = { .range = { (unsigned long)area, 8 * PG },
				       .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("register");
		return 1;
	}
	copy(uffd, 0, 'a', 0);   /* present */
	/* page 1: a hole */
	copy(uffd, 2, 'c', 1);   /* present, write-protected */
	copy(uffd, 3, 'd', 0);   /* present, to be unmapped in the child */
	copy(uffd, 4, 'e', 0);   /* present, MADV_DONTNEED in the child */
	pipe(to_parent);
	pipe(to_child);
	pthread_create(&t, NULL, reader, NULL);
	signal(SIGBUS, on_bus);
	pid = fork();
	if (pid == 0) {
		char r[256];
		int n = 0;
		double t0;
		n += snprintf(r + n, sizeof(r) - n, "page0 '%c';", area[0]);
		if (!sigsetjmp(jb, 1))
			area[2 * PG] = 'C';
		n += snprintf(r + n, sizeof(r) - n, " write wp page2: %s;", bus ? "SIGBUS" : "no fault");
		bus = 0;
		if (!sigsetjmp(jb, 1))
			c = area[1 * PG];
		n += snprintf(r + n, sizeof(r) - n, " read hole page1: %s", bus ? "SIGBUS" : "read");
		write(to_parent[1], r, strlen(r) + 1);
		read(to_child[0], &c, 1);
		bus = 0;
		if (!sigsetjmp(jb, 1))
			c = area[1 * PG];
		printf("child: after the parent's UFFDIO_COPY through cfd: page1 %s '%c'\n", bus ? "SIGBUS" : "read", bus ? '?' : c);
		fflush(stdout);
		t0 = now();
		munmap(area + 3 * PG, PG);
		printf("child: munmap of a registered page returned after %.2f s\n", now() - t0);
		t0 = now();
		madvise(area + 4 * PG, PG, MADV_DONTNEED);
		printf("child: MADV_DONTNEED returned after %.2f s\n", now() - t0);
		fflush(stdout);
		_exit(0);
	}
	pthread_join(t, NULL);
	{
		char r[256] = "";
		struct uffdio_api a2 = { .api = UFFD_API };
		int rc = ioctl(cfd, UFFDIO_API, &a2);
		printf("parent: UFFDIO_API on the child's uffd: %s (features it reports %#llx)\n",
		       rc ? strerror(errno) : "ok", (unsigned long long)a2.features);
		read(to_parent[0], r, sizeof(r));
		printf("child: %s\n", r);
		fflush(stdout);
		copy(cfd, 1, 'b', 0);
		write(to_child[1], "x", 1);
		sleep(2);
		for (int k = 0; k < 2; k++) {
			struct uffd_msg m;
			int fl = fcntl(cfd, F_GETFL);
			fcntl(cfd, F_SETFL, fl | O_NONBLOCK);
			ssize_t got = read(cfd, &m, sizeof(m));
			if (got == sizeof(m))
				printf("parent: child's uffd event %s\n", m.event == UFFD_EVENT_UNMAP ? "UNMAP" :
				       m.event == UFFD_EVENT_REMOVE ? "REMOVE" : "other");
			else
				printf("parent: no event on the child's uffd (%s)\n", strerror(errno));
			fflush(stdout);
			sleep(2);
		}
		waitpid(pid, NULL, 0);
	}
	return 0;
}
