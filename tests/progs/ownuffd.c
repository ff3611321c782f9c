/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ownuffd: a program with a userfaultfd of its own (as QEMU's postcopy and
 * Firecracker's snapshot restore have) registers memory that farmem pages:
 * written past the budget first, so that much of it is remote. The range
 * must come home whole (every byte as written), and then be the program's:
 * a page it drops faults to its own userfaultfd, which it serves.
 *
 *   ownuffd MiB [syscall]   (prints "ownuffd: ok", or what went wrong)
 *
 * syscall: UFFDIO_REGISTER through glibc's syscall(SYS_ioctl, ...) instead
 * of ioctl().
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE 4096ul

static int uffd;
static uint8_t fill_page[PAGE];

static uint64_t word(size_t page)
{
	return (page + 1) * 0x9e3779b97f4a7c15ull;
}

/* Serves one fault of the program's own userfaultfd with fill_page. */
static void *serve(void *arg)
{
	struct uffd_msg m;
	struct pollfd p = { .fd = uffd, .events = POLLIN };

	(void)arg;
	if (poll(&p, 1, 10000) != 1 || read(uffd, &m, sizeof(m)) != sizeof(m) || m.event != UFFD_EVENT_PAGEFAULT)
		return (void *)1;
	struct uffdio_copy c = { .dst = m.arg.pagefault.address & ~(PAGE - 1), .src = (uintptr_t)fill_page, .len = PAGE };
	return (void *)(uintptr_t)(ioctl(uffd, UFFDIO_COPY, &c) != 0);
}

int main(int argc, char **argv)
{
	size_t len = (argc > 1 ? strtoul(argv[1], NULL, 0) : 64) << 20, pages = len / PAGE;
	int via_syscall = argc > 2 && !strcmp(argv[2], "syscall");
	uint64_t *w;
	uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pthread_t t;
	void *served;

	if (m == MAP_FAILED)
		return printf("ownuffd: mmap: %s\n", strerror(errno)), 1;
	for (size_t p = 0; p < pages; p++)
		*(uint64_t *)(m + p * PAGE) = word(p);
	uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (uffd < 0)
		return printf("ownuffd: userfaultfd: %s\n", strerror(errno)), 1;
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .range = { (uintptr_t)m, len }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (ioctl(uffd, UFFDIO_API, &api))
		return printf("ownuffd: UFFDIO_API: %s\n", strerror(errno)), 1;
	if (via_syscall ? syscall(SYS_ioctl, uffd, UFFDIO_REGISTER, &reg) : ioctl(uffd, UFFDIO_REGISTER, &reg))
		return printf("ownuffd: UFFDIO_REGISTER: %s\n", strerror(errno)), 1;
	/* Every page came home: none of them faults to this userfaultfd (nothing would serve it). */
	for (size_t p = 0; p < pages; p++)
		if (*(uint64_t *)(m + p * PAGE) != word(p))
			return printf("ownuffd: page %zu reads %#llx\n", p, (unsigned long long)*(uint64_t *)(m + p * PAGE)), 1;
	/* A page dropped now is this program's to serve. */
	memset(fill_page, 0x5a, PAGE);
	w = (uint64_t *)(m + 7 * PAGE);
	if (madvise(w, PAGE, MADV_DONTNEED) || pthread_create(&t, NULL, serve, NULL))
		return printf("ownuffd: madvise: %s\n", strerror(errno)), 1;
	if (*w != 0x5a5a5a5a5a5a5a5aull)
		return printf("ownuffd: the dropped page reads %#llx\n", (unsigned long long)*w), 1;
	pthread_join(t, &served);
	if (served)
		return printf("ownuffd: its own fault was not served\n"), 1;
	printf("ownuffd: ok\n");
	return 0;
}
