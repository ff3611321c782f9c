/* SPDX-License-Identifier: Apache-2.0 */
/*
 * iotest: system calls on paged memory that the pager has evicted, and a
 * program's own SIGBUS. With faults served in the faulting thread the kernel
 * cannot wait for a page, so a read() into an evicted buffer would fail with
 * EFAULT unless the shim covers it (uffd/preload_io.c). Each check evicts the
 * buffer first (touching a second, bigger region under a small budget), then:
 *
 *   read, pread, readv   a file's bytes into the evicted buffer (and readv's
 *                        iovec array itself lives in paged memory)
 *   write, writev        the evicted buffer out to a file, read back
 *   stdio                fread into and fwrite out of the evicted buffer: glibc
 *                        moves a request larger than the stream's buffer with its
 *                        own read and write, which only the fread/fwrite covers see;
 *                        then a stream whose buffer (setvbuf) is in the buffer, written
 *                        and read back while it is evicted (under fault=signal its
 *                        lines were lost, "Bad address" at fflush, before session 35)
 *   fortify              __read_chk, __pread_chk, __fread_chk and __recv_chk (what
 *                        a program built with _FORTIFY_SOURCE calls) into the evicted
 *                        buffer: glibc's own go to its internal read, past the covers
 *   big                  pread, read, write and getrandom of three quarters of the
 *                        buffer, more than the budget: the shim moves them in pieces,
 *                        so the budget holds (the test compares the summary's peak
 *                        with the limit)
 *   send/recv            the evicted buffer through a socketpair into another
 *                        evicted part of it; sendmsg/recvmsg likewise, and
 *                        sendmmsg/recvmmsg with their arrays in paged memory too
 *   sigbus               the program's own SIGBUS handler, installed after the
 *                        pager started, still runs for a truncated file mapping,
 *                        and paging goes on after it; each of sigaction, signal,
 *                        bsd_signal, sysv_signal, __sysv_signal, ssignal and sigset
 *                        installs it in turn
 *   blocked              a thread that blocks every signal still pages, however it
 *                        blocks them (pthread_sigmask, sigprocmask, sighold,
 *                        sigset's SIG_HOLD, sigblock, sigsetmask); so does a
 *                        handler whose mask blocks every signal, one run inside
 *                        sigsuspend, ppoll, pselect or epoll_pwait with every other
 *                        signal blocked, and a program
 *                        that ignores SIGBUS (sigignore), which then ignores one sent
 *   protect              a part of the buffer made PROT_NONE, then pressure, then
 *                        made readable again: every byte as it was (the evictor
 *                        read unreadable pages, a SIGSEGV, before mprotect was
 *                        covered)
 *   cancel               threads blocked in read() into paged memory and in sem_wait
 *                        on a paged semaphore are cancelled, 1100 times: each gives
 *                        its pin back (a pin kept would show in the summary's
 *                        peak_pins), and none stays blocked
 *   sync                 semaphores, mutexes, condition variables, rwlocks and a
 *                        barrier that live in paged memory, used by 8 threads while
 *                        another evicts: glibc aborts ("The futex facility returned
 *                        an unexpected error code") when the kernel's read of a
 *                        waiter's futex word fails with EFAULT (uffd/preload_sync.c);
 *                        then 100 sleepers at once, each on a page of its own
 *   stacks               32 coroutines (makecontext) on stacks carved from the
 *                        buffer, switched through under eviction; a thread on a
 *                        stack there (pthread_attr_setstack), another given its
 *                        top only (pthread_attr_setstackaddr), which died of
 *                        SIGBUS at its start before session 36; a handler on an
 *                        alternate stack there (sigaltstack): with faults served in
 *                        the faulting thread the coroutines died of SIGSEGV at their
 *                        first fault before the shim kept such stacks local
 *   ownstack             (x86-64) a stack switched to by the program's own assembly,
 *                        as Erlang's JIT does, in the buffer, evicted: paged memory
 *                        read and written from it under eviction, its own frame
 *                        kept (it died of SIGSEGV at its first fault before session 34);
 *                        then a new thread whose first fault is there (before session
 *                        35 it died: its alternate stack was set at its first fault);
 *                        from there, a mapping made, advised, protected and unmapped
 *                        (the pager's frames for it ran onto the evicted stack under
 *                        its lock before session 38: "Resource deadlock avoided");
 *                        a block malloc'd, realloc'd, freed and calloc'd there
 *                        (the same deadlock through the malloc family before 39);
 *                        a read into evicted memory from there, evicting as it
 *                        goes (it ran before 39 too: a guard)
 *   exits                200 threads, one after another, each reading an evicted page
 *                        and ending by pthread_exit or by cancellation
 *   poll                 epoll_wait, epoll_pwait, poll, ppoll, select and pselect
 *                        with their arrays in the evicted buffer: each finds the one
 *                        ready descriptor (each failed with EFAULT before session 34)
 *   exec                 posix_spawn, posix_spawnp, execve, execvpe, execle and
 *                        execl (in a vfork child), system and popen, with the
 *                        path, every argument and environment string, and the
 *                        vectors in the evicted buffer: sh checks what it got
 *                        (each failed with EFAULT before session 45); and a
 *                        shell that exits 127 runs once, with errno EFAULT before
 *   close                every descriptor but 0-2 closed the ways a daemon does it
 *                        (a loop to 1024, close_range, closefrom): paging goes on
 *                        and the file the program opens next holds only its bytes
 *                        (the pager stopped it, 70, at its next eviction before); then
 *                        the file dup2'd (and dup3'd) onto every other number below
 *                        1024: farmem's refuse with EBUSY (before session 35 the pager's
 *                        traffic went into the file)
 *   syscall              glibc's syscall() instead of the functions: a mapping made by
 *                        syscall(SYS_mmap) (SBCL maps its heap so) is paged, keeps its
 *                        bytes under eviction, reads zeros where syscall(SYS_madvise,
 *                        MADV_DONTNEED) dropped it while evicted, and goes with
 *                        syscall(SYS_munmap); so does the buffer (mmap's) where
 *                        syscall(SYS_madvise) dropped it; syscall(SYS_pread64) and SYS_read
 *                        into the evicted buffer, and a FUTEX_WAIT on a word of it, do not
 *                        fail with EFAULT (uffd/preload_syscall.c), nor does an
 *                        rt_sigprocmask whose set was evicted (any other number)
 *   raw                  (not in the default set) the syscall instruction itself (x86-64),
 *                        which no cover sees, reading into the evicted buffer: prints "raw:
 *                        efault" or "raw: ok" (with faults served in the faulting thread
 *                        it fails: what the covers are for)
 *
 * Every byte is checked. Exit 0 when all pass, 1 on a wrong byte or a failed
 * call (with a message), 2 on usage.
 *
 *   iotest [--size 128M] [--pressure 256M] [--only NAME]
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <semaphore.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>
#include <linux/futex.h>

#include "raw_syscall.h"
#include "resmap_self.h"
#include "../../bench/progs/size_arg.h"

#define PAGE 4096ul
#define CHUNK (4ul << 20)

static uint8_t *buf, *pressure;
static size_t size = 128ul << 20, pressure_size = 256ul << 20;
static int failed;

#define FAIL(...) do { fprintf(stderr, "iotest: " __VA_ARGS__); fputc('\n', stderr); failed = 1; } while (0)

static uint8_t pattern(uint64_t i, unsigned salt)
{
	uint64_t x = (i / 8 + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)salt << 56);
	x ^= x >> 29;
	return (uint8_t)(x >> ((i % 8) * 8));
}

static void fill(uint8_t *p, size_t n, uint64_t at, unsigned salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern(at + i, salt);
}

static int check(const uint8_t *p, size_t n, uint64_t at, unsigned salt, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pattern(at + i, salt)) {
			FAIL("%s: byte %zu is %#x, expected %#x", what, i, p[i], pattern(at + i, salt));
			return -1;
		}
	return 0;
}

/* Touch every page of the pressure region: under a budget smaller than it, buf's pages leave. */
static void evict_buf(void)
{
	for (size_t i = 0; i < pressure_size; i += PAGE)
		pressure[i] = (uint8_t)(pressure[i] + 1);
}

static int temp_file(const uint8_t *src, size_t n)
{
	char path[] = "/tmp/iotest-XXXXXX";
	int fd = mkstemp(path);

	if (fd < 0) {
		perror("iotest: mkstemp");
		exit(1);
	}
	unlink(path);
	if (src && write(fd, src, n) != (ssize_t)n) {
		perror("iotest: write to a temporary file");
		exit(1);
	}
	return fd;
}

static void t_read(void)
{
	uint8_t *src = malloc(CHUNK);
	int fd;

	fill(src, CHUNK, 0, 7);
	fd = temp_file(src, CHUNK);
	evict_buf();
	if (pread(fd, buf + 8 * PAGE, CHUNK, 0) != (ssize_t)CHUNK)
		FAIL("pread into an evicted buffer: %s", strerror(errno));
	else
		check(buf + 8 * PAGE, CHUNK, 0, 7, "pread");
	evict_buf();
	if (lseek(fd, 0, SEEK_SET) < 0 || read(fd, buf + size / 2, CHUNK) != (ssize_t)CHUNK)
		FAIL("read into an evicted buffer: %s", strerror(errno));
	else
		check(buf + size / 2, CHUNK, 0, 7, "read");
	/* readv, with the iovec array itself in paged memory. */
	{
		struct iovec *iov = (struct iovec *)(buf + size - PAGE);
		iov[0] = (struct iovec){ buf + 100 * PAGE + 17, CHUNK / 4 };
		iov[1] = (struct iovec){ buf + 3 * size / 4, CHUNK / 4 };
		iov[2] = (struct iovec){ buf + size / 4 + 5, CHUNK / 2 };
		evict_buf();
		if (lseek(fd, 0, SEEK_SET) < 0 || readv(fd, iov, 3) != (ssize_t)CHUNK) {
			FAIL("readv into an evicted buffer: %s", strerror(errno));
		} else {
			check(iov[0].iov_base, CHUNK / 4, 0, 7, "readv[0]");
			check(iov[1].iov_base, CHUNK / 4, CHUNK / 4, 7, "readv[1]");
			check(iov[2].iov_base, CHUNK / 2, CHUNK / 2, 7, "readv[2]");
		}
	}
	close(fd);
	free(src);
}

static void t_write(void)
{
	uint8_t *back = malloc(2 * CHUNK);
	struct iovec iov[2];
	int fd = temp_file(NULL, 0);

	fill(buf + 40 * PAGE, CHUNK, 40 * PAGE, 9);
	fill(buf + size - CHUNK - PAGE, CHUNK, 3, 11);
	evict_buf();
	if (write(fd, buf + 40 * PAGE, CHUNK) != (ssize_t)CHUNK)
		FAIL("write from an evicted buffer: %s", strerror(errno));
	evict_buf();
	iov[0] = (struct iovec){ buf + size - CHUNK - PAGE, CHUNK / 2 };
	iov[1] = (struct iovec){ buf + size - CHUNK / 2 - PAGE, CHUNK / 2 };
	if (writev(fd, iov, 2) != (ssize_t)CHUNK)
		FAIL("writev from an evicted buffer: %s", strerror(errno));
	if (pread(fd, back, 2 * CHUNK, 0) != (ssize_t)(2 * CHUNK)) {
		FAIL("reading back: %s", strerror(errno));
	} else {
		check(back, CHUNK, 40 * PAGE, 9, "write");
		check(back + CHUNK, CHUNK, 3, 11, "writev");
	}
	/* The buffer itself is intact. */
	check(buf + 40 * PAGE, CHUNK, 40 * PAGE, 9, "buffer after write");
	close(fd);

	/*
	 * vmsplice: a pipe's write end takes the evicted pages themselves, its
	 * read end copies into evicted pages (EFAULT under fault=signal before
	 * session 35).
	 */
	{
		int pv[2];
		size_t n = 16 * PAGE;
		struct iovec from = { buf + 40 * PAGE, n }, into = { buf + size / 2 + 77 * PAGE, n };

		if (pipe(pv)) {
			FAIL("pipe: %s", strerror(errno));
		} else {
			fcntl(pv[1], F_SETPIPE_SZ, (int)n);
			evict_buf();
			if (vmsplice(pv[1], &from, 1, SPLICE_F_NONBLOCK) != (ssize_t)n)
				FAIL("vmsplice from an evicted buffer: %s", strerror(errno));
			evict_buf();
			if (vmsplice(pv[0], &into, 1, SPLICE_F_NONBLOCK) != (ssize_t)n)
				FAIL("vmsplice into an evicted buffer: %s", strerror(errno));
			else
				check(buf + size / 2 + 77 * PAGE, n, 40 * PAGE, 9, "vmsplice through a pipe");
			close(pv[0]);
			close(pv[1]);
			fill(buf + size / 2 + 77 * PAGE, n, size / 2 + 77 * PAGE, 1); /* as main left it */
		}
	}
	free(back);
}

static void t_stdio(void)
{
	uint8_t *src = malloc(CHUNK), *back = malloc(CHUNK);
	int fd;
	FILE *f;

	fill(src, CHUNK, 0, 13);
	fd = temp_file(src, CHUNK);
	f = fdopen(fd, "r+");
	if (!f || !back) {
		perror("iotest: fdopen");
		exit(1);
	}
	evict_buf();
	if (fseek(f, 0, SEEK_SET) || fread(buf + 200 * PAGE + 33, 1, CHUNK, f) != CHUNK)
		FAIL("fread into an evicted buffer: %s", ferror(f) ? strerror(errno) : "end of file");
	else
		check(buf + 200 * PAGE + 33, CHUNK, 0, 13, "fread");
	fill(buf + 3 * size / 8, CHUNK, 5, 15);
	evict_buf();
	if (fseek(f, 0, SEEK_SET) || fwrite(buf + 3 * size / 8, 1, CHUNK, f) != CHUNK || fflush(f))
		FAIL("fwrite from an evicted buffer: %s", strerror(errno));
	else if (pread(fd, back, CHUNK, 0) != (ssize_t)CHUNK)
		FAIL("reading back: %s", strerror(errno));
	else
		check(back, CHUNK, 5, 15, "fwrite");
	fclose(f);

	/*
	 * A stream whose buffer is the program's, in paged memory (setvbuf): glibc
	 * fills and drains it with its own read and write, past the covers.
	 */
	{
		uint8_t *vbuf = buf + 5 * size / 8 + 3 * PAGE;
		char line[64], want[64];
		size_t vlen = 64 * PAGE;
		int bad = 0;

		fd = temp_file(src, 0);
		f = fdopen(fd, "w+");
		if (!f || setvbuf(f, (char *)vbuf, _IOFBF, vlen)) {
			FAIL("setvbuf: %s", strerror(errno));
			free(src);
			free(back);
			return;
		}
		for (int k = 0; k < 20000 && !bad; k++) {
			if (k % 4000 == 0)
				evict_buf(); /* the stream's buffer leaves between its fills */
			bad = fprintf(f, "line %d of a stream with its buffer in paged memory\n", k) < 0;
		}
		evict_buf();
		if (bad || fflush(f) || fseek(f, 0, SEEK_SET))
			FAIL("setvbuf: writing a stream through a paged buffer: %s", strerror(errno));
		for (int k = 0; k < 20000 && !bad; k++) {
			if (k % 4000 == 0)
				evict_buf();
			snprintf(want, sizeof(want), "line %d of a stream with its buffer in paged memory\n", k);
			if (!fgets(line, sizeof(line), f) || strcmp(line, want)) {
				FAIL("setvbuf: line %d read back through a paged buffer: %s", k,
				     ferror(f) ? strerror(errno) : "not as written");
				bad = 1;
			}
		}
		fclose(f);
	}
	free(src);
	free(back);
}

/*
 * What a program built with _FORTIFY_SOURCE calls for a read of a variable
 * length into a buffer of a size the compiler knows (a fixed-size malloc):
 * glibc's own go to its internal read, past the covers.
 */
extern ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen);
extern ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen);
extern ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags);
extern size_t __fread_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp);

static void t_fortify(void)
{
	uint8_t *src = malloc(CHUNK), *at = buf + 300 * PAGE;
	int fd, sv[2];
	FILE *f;

	fill(src, CHUNK, 0, 43);
	fd = temp_file(src, CHUNK);
	evict_buf();
	if (__pread_chk(fd, at, CHUNK, 0, CHUNK) != (ssize_t)CHUNK)
		FAIL("__pread_chk into an evicted buffer: %s", strerror(errno));
	else
		check(at, CHUNK, 0, 43, "__pread_chk");
	evict_buf();
	if (lseek(fd, 0, SEEK_SET) < 0 || __read_chk(fd, at, CHUNK, CHUNK) != (ssize_t)CHUNK)
		FAIL("__read_chk into an evicted buffer: %s", strerror(errno));
	else
		check(at, CHUNK, 0, 43, "__read_chk");
	f = fdopen(fd, "r");
	evict_buf();
	if (!f || fseek(f, 0, SEEK_SET) || __fread_chk(at, CHUNK, 1, CHUNK, f) != CHUNK)
		FAIL("__fread_chk into an evicted buffer: %s", f && ferror(f) ? strerror(errno) : "end of file");
	else
		check(at, CHUNK, 0, 43, "__fread_chk");
	if (f)
		fclose(f);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		FAIL("socketpair: %s", strerror(errno));
	} else {
		evict_buf();
		if (write(sv[0], src, 64 * 1024) != 64 * 1024 ||
		    __recv_chk(sv[1], at, 64 * 1024, CHUNK, MSG_WAITALL) != 64 * 1024)
			FAIL("__recv_chk into an evicted buffer: %s", strerror(errno));
		else
			check(at, 64 * 1024, 0, 43, "__recv_chk");
		close(sv[0]);
		close(sv[1]);
	}
	free(src);
}

static void t_big(void)
{
	size_t n = size / 4 * 3, zero = 0;
	uint8_t *src = malloc(n);
	int fd, out;

	if (!src) {
		FAIL("big: malloc: %s", strerror(errno));
		return;
	}
	fill(src, n, 0, 23);
	fd = temp_file(src, n);
	evict_buf();
	if (pread(fd, buf, n, 0) != (ssize_t)n)
		FAIL("big: pread: %s", strerror(errno));
	else
		check(buf, n, 0, 23, "big pread");
	evict_buf();
	memset(buf, 0, n);
	if (lseek(fd, 0, SEEK_SET) || read(fd, buf, n) != (ssize_t)n)
		FAIL("big: read: %s", strerror(errno));
	else
		check(buf, n, 0, 23, "big read");
	evict_buf();
	out = temp_file(buf, n); /* a write of all of it */
	memset(src, 0, n);
	if (pread(out, src, n, 0) != (ssize_t)n)
		FAIL("big: reading the write back: %s", strerror(errno));
	else
		check(src, n, 0, 23, "big write");
	evict_buf();
	if (getrandom(buf, n, 0) != (ssize_t)n)
		FAIL("big: getrandom: %s", strerror(errno));
	for (size_t i = 0; i < n; i += PAGE)
		zero += !buf[i] && !buf[i + 1] && !buf[i + 2] && !buf[i + 3];
	if (zero > n / PAGE / 100)
		FAIL("big: getrandom left %zu of %zu pages starting with four zero bytes", zero, n / PAGE);
	fill(buf, n, 0, 1); /* as main left it */
	close(fd);
	close(out);
	free(src);
}

/*
 * sendmmsg and recvmmsg: four datagrams out of and into evicted parts of the
 * buffer, with the message arrays and iovecs themselves in paged memory.
 */
#define MMSG 4
#define MMSG_LEN (16 * 1024)

static void t_mmsg(void)
{
	int sv[2];
	size_t out = size / 2 + 64 * PAGE + 5, in = size / 2 + 128 * PAGE + 9;
	struct mmsghdr *mo = (struct mmsghdr *)(buf + size / 2 + 8 * PAGE);
	struct mmsghdr *mi = (struct mmsghdr *)(buf + size / 2 + 24 * PAGE);
	struct iovec *io = (struct iovec *)(buf + size / 2 + 40 * PAGE);

	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv)) {
		FAIL("socketpair (datagrams): %s", strerror(errno));
		return;
	}
	for (int k = 0; k < MMSG; k++) {
		io[k] = (struct iovec){ buf + out + (size_t)k * 5 * PAGE, MMSG_LEN };
		io[MMSG + k] = (struct iovec){ buf + in + (size_t)k * 5 * PAGE, MMSG_LEN };
		mo[k] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &io[k], .msg_iovlen = 1 } };
		mi[k] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &io[MMSG + k], .msg_iovlen = 1 } };
		fill(buf + out + (size_t)k * 5 * PAGE, MMSG_LEN, (uint64_t)k << 20, 17);
	}
	evict_buf();
	if (sendmmsg(sv[0], mo, MMSG, 0) != MMSG)
		FAIL("sendmmsg from an evicted buffer: %s", strerror(errno));
	evict_buf();
	if (recvmmsg(sv[1], mi, MMSG, MSG_DONTWAIT, NULL) != MMSG) {
		FAIL("recvmmsg into an evicted buffer: %s", strerror(errno));
	} else {
		for (int k = 0; k < MMSG; k++)
			if (mo[k].msg_len != MMSG_LEN || mi[k].msg_len != MMSG_LEN ||
			    check(buf + in + (size_t)k * 5 * PAGE, MMSG_LEN, (uint64_t)k << 20, 17, "sendmmsg/recvmmsg"))
				FAIL("sendmmsg/recvmmsg: message %d: %u sent, %u received", k, mo[k].msg_len,
				     mi[k].msg_len);
	}
	close(sv[0]);
	close(sv[1]);
}

static void t_socket(void)
{
	int sv[2];
	size_t n = 64 * 1024, off_in = 2 * PAGE + 3, off_out = size / 3;
	struct iovec iov_out = { buf + off_out, n }, iov_in = { buf + off_in, n };
	struct msghdr mo = { .msg_iov = &iov_out, .msg_iovlen = 1 };
	struct msghdr mi = { .msg_iov = &iov_in, .msg_iovlen = 1 };

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
		FAIL("socketpair: %s", strerror(errno));
		return;
	}
	fill(buf + off_out, n, 0, 13);
	evict_buf();
	if (send(sv[0], buf + off_out, n, 0) != (ssize_t)n)
		FAIL("send from an evicted buffer: %s", strerror(errno));
	evict_buf();
	if (recv(sv[1], buf + off_in, n, MSG_WAITALL) != (ssize_t)n)
		FAIL("recv into an evicted buffer: %s", strerror(errno));
	else
		check(buf + off_in, n, 0, 13, "send/recv");
	fill(buf + off_out, n, 0, 15);
	evict_buf();
	if (sendmsg(sv[0], &mo, 0) != (ssize_t)n)
		FAIL("sendmsg from an evicted buffer: %s", strerror(errno));
	evict_buf();
	if (recvmsg(sv[1], &mi, MSG_WAITALL) != (ssize_t)n)
		FAIL("recvmsg into an evicted buffer: %s", strerror(errno));
	else
		check(buf + off_in, n, 0, 15, "sendmsg/recvmsg");
	close(sv[0]);
	close(sv[1]);
	t_mmsg();
}

static sigjmp_buf bus_jmp;
static volatile sig_atomic_t bus_seen, bus_armed;

static void on_bus(int sig)
{
	static const char msg[] = "iotest: the program's SIGBUS handler ran for a paging fault\n";

	/* Only the truncated mapping's SIGBUS may come here; a paging fault must not. */
	if (!bus_armed) {
		(void)!write(2, msg, sizeof(msg) - 1);
		_exit(1);
	}
	bus_armed = 0;
	bus_seen++;
	siglongjmp(bus_jmp, 1);
}

/*
 * Every name under which glibc lets a program install a SIGBUS handler; the
 * old ones are deprecated but still used (vim imports sigset, dash
 * sigsetmask, zstd __sysv_signal).
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
extern sighandler_t bsd_signal(int sig, sighandler_t h);
static void by_sigaction(void)
{
	struct sigaction sa = { .sa_handler = on_bus };

	sigaction(SIGBUS, &sa, NULL);
}
static void by_signal(void) { signal(SIGBUS, on_bus); }
static void by_bsd_signal(void) { bsd_signal(SIGBUS, on_bus); }
static void by_sysv_signal(void) { sysv_signal(SIGBUS, on_bus); }
static void by___sysv_signal(void) { __sysv_signal(SIGBUS, on_bus); }
static void by_ssignal(void) { ssignal(SIGBUS, on_bus); }
static void by_sigset(void) { sigset(SIGBUS, on_bus); }
#pragma GCC diagnostic pop

static void sigbus_by(const char *name, void (*install)(void))
{
	int fd = temp_file(NULL, 0);
	volatile uint8_t *m;

	bus_seen = 0;
	if (ftruncate(fd, 2 * PAGE)) {
		FAIL("ftruncate: %s", strerror(errno));
		return;
	}
	m = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		FAIL("mmap of a file: %s", strerror(errno));
		return;
	}
	/* Installed after the pager has started (buf is paged by now). */
	install();
	if (ftruncate(fd, 0)) {
		FAIL("ftruncate: %s", strerror(errno));
		return;
	}
	if (!sigsetjmp(bus_jmp, 1)) {
		bus_armed = 1;
		(void)m[PAGE];
	}
	bus_armed = 0;
	if (bus_seen != 1)
		FAIL("a SIGBUS handler installed by %s ran %d times for a truncated mapping, not once", name, (int)bus_seen);
	/* Paging goes on, and the program's handler does not see paging faults. */
	fill(buf, CHUNK, 0, 17);
	evict_buf();
	check(buf, CHUNK, 0, 17, name);
	munmap((void *)m, 2 * PAGE);
	close(fd);
}

static void t_sigbus(void)
{
	static const struct { const char *name; void (*install)(void); } ways[] = {
		{ "sigaction", by_sigaction }, { "signal", by_signal }, { "bsd_signal", by_bsd_signal },
		{ "sysv_signal", by_sysv_signal }, { "__sysv_signal", by___sysv_signal },
		{ "ssignal", by_ssignal }, { "sigset", by_sigset },
	};

	for (size_t k = 0; k < sizeof(ways) / sizeof(ways[0]) && !failed; k++)
		sigbus_by(ways[k].name, ways[k].install);
	signal(SIGBUS, SIG_DFL);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* Every way glibc has to block SIGBUS in a thread (BSD's and SysV's too). */
static void block_by(int k)
{
	sigset_t all;

	sigfillset(&all);
	switch (k) {
	case 0: pthread_sigmask(SIG_BLOCK, &all, NULL); break;
	case 1: sigprocmask(SIG_SETMASK, &all, NULL); break;
	case 2: sighold(SIGBUS); break;
	case 3: sigset(SIGBUS, SIG_HOLD); break;
	case 4: sigblock(1 << (SIGBUS - 1)); break;
	case 5: sigsetmask(~0); break;
	}
}
#pragma GCC diagnostic pop

static const char *const block_names[] = {
	"pthread_sigmask", "sigprocmask", "sighold", "sigset(SIG_HOLD)", "sigblock", "sigsetmask",
};

static void *blocked_worker(void *arg)
{
	int k = (int)(intptr_t)arg;

	block_by(k);
	fill(buf + CHUNK, CHUNK, CHUNK, 19 + k);
	evict_buf();
	check(buf + CHUNK, CHUNK, CHUNK, 19 + k, block_names[k]);
	return NULL;
}

static void on_usr_paging(int sig)
{
	check(buf + 2 * CHUNK, CHUNK, 2 * CHUNK, 31, sig == SIGUSR1 ? "a handler that blocks every signal" :
	      "a handler run inside sigsuspend, ppoll, pselect or epoll_pwait with every other signal blocked");
}

/*
 * A fault taken while SIGBUS is blocked kills the process: the kernel
 * cannot deliver it. Threads that block every signal, however they do it,
 * still page; so do a handler whose mask blocks every signal and one run
 * inside sigsuspend with every other signal blocked.
 */
static void t_blocked(void)
{
	struct sigaction sa = { .sa_handler = on_usr_paging };
	sigset_t usr2, all_but, old;
	pthread_t th;

	for (int k = 0; k < (int)(sizeof(block_names) / sizeof(block_names[0])); k++) {
		pthread_create(&th, NULL, blocked_worker, (void *)(intptr_t)k);
		pthread_join(th, NULL);
	}
	fill(buf + 2 * CHUNK, CHUNK, 2 * CHUNK, 31);
	sigfillset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	evict_buf();
	raise(SIGUSR1);

	/* The same handler run inside each call that sleeps with a mask of its own. */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL);
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	sigfillset(&all_but);
	sigdelset(&all_but, SIGUSR2);
	for (int k = 0; k < 4; k++) {
		struct timespec soon = { .tv_sec = 5 };
		int ep = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event ev;

		sigprocmask(SIG_BLOCK, &usr2, &old);
		raise(SIGUSR2);
		evict_buf();
		if (k == 0)
			sigsuspend(&all_but);
		else if (k == 1)
			ppoll(NULL, 0, &soon, &all_but);
		else if (k == 2)
			pselect(0, NULL, NULL, NULL, &soon, &all_but);
		else
			epoll_pwait(ep, &ev, 1, 5000, &all_but);
		sigprocmask(SIG_SETMASK, &old, NULL);
		close(ep);
	}

	/* SIGBUS ignored: paging faults are still the pager's. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
	sigignore(SIGBUS);
#pragma GCC diagnostic pop
	fill(buf + 3 * CHUNK, CHUNK, 3 * CHUNK, 37);
	evict_buf();
	check(buf + 3 * CHUNK, CHUNK, 3 * CHUNK, 37, "SIGBUS ignored by sigignore");
	raise(SIGBUS); /* sent, not a fault: ignored, as it would be without farmem */
	signal(SIGBUS, SIG_DFL);
}

/*
 * Stacks the program makes of paged memory: coroutines (makecontext), a
 * thread on a stack of its own (pthread_attr_setstack) and an alternate
 * signal stack. A paging fault on such a stack cannot come by SIGBUS (the
 * kernel writes the signal's frame on that stack): coroutines on stacks
 * carved from a malloc'd block died of SIGSEGV at their first fault.
 */
#define COROUTINES 32
#define CO_STACK (128u << 10)
static ucontext_t co_main, co_ctx[COROUTINES];
static uint64_t co_sum[COROUTINES];

static uint64_t co_deep(int depth, int id)
{
	volatile uint8_t frame[2048];

	for (size_t i = 0; i < sizeof(frame); i++)
		frame[i] = (uint8_t)(i + (size_t)depth + (size_t)id);
	if (depth == 0) {
		swapcontext(&co_ctx[id], &co_main); /* out with the whole depth on this stack */
		return frame[11];
	}
	return co_deep(depth - 1, id) + frame[depth % sizeof(frame)];
}

static void co_body(int id)
{
	for (int round = 0; round < 3; round++)
		co_sum[id] += co_deep(20 + id, id);
}

static uint64_t co_want(int id)
{
	uint64_t one = (uint8_t)(11 + id);

	for (int d = 1; d <= 20 + id; d++)
		one += (uint8_t)(d % 2048 + (size_t)d + (size_t)id);
	return 3 * one;
}

static void *own_stack_worker(void *arg)
{
	fill(buf + CHUNK, CHUNK, CHUNK, 41);
	evict_buf();
	check(buf + CHUNK, CHUNK, CHUNK, 41, "a thread on a stack of paged memory");
	return arg;
}

/*
 * A thread on a stack given by pthread_attr_setstackaddr (its top only) and
 * pthread_attr_setstacksize, evicted before it starts; then fstat into its
 * frame, on a page it has not touched. Under fault=signal before session 36
 * (only pthread_attr_setstack handed the shim the whole stack) the process
 * died of SIGBUS: the thread's first fault on its stack came while glibc
 * starts it with every signal blocked.
 */
static void *top_only_stack_worker(void *arg)
{
	struct stat sts[64]; /* 9 KiB: its middle pages untouched before the call */
	int fd = *(int *)arg;

	if (fstat(fd, &sts[32]))
		return (void *)(intptr_t)errno;
	return sts[32].st_size == 4321 ? NULL : (void *)(intptr_t)-1;
}

static volatile sig_atomic_t alt_ran;

static void on_usr_alt(int sig)
{
	volatile uint8_t frame[4096];

	for (size_t i = 0; i < sizeof(frame); i++)
		frame[i] = (uint8_t)i;
	alt_ran = sig + frame[100];
}

static void t_stacks(void)
{
	uint8_t *stacks = buf + size - 16 * CHUNK / 4; /* 16 MiB at the end, apart from the other parts */
	struct sigaction sa = { .sa_handler = on_usr_alt, .sa_flags = SA_ONSTACK };
	stack_t alt = { .ss_sp = stacks + COROUTINES * CO_STACK + (4u << 20), .ss_size = 256u << 10 };
	pthread_attr_t attr;
	pthread_t th;
	void *back = NULL;

	for (int i = 0; i < COROUTINES; i++) {
		getcontext(&co_ctx[i]);
		co_ctx[i].uc_stack.ss_sp = stacks + (size_t)i * CO_STACK;
		co_ctx[i].uc_stack.ss_size = CO_STACK;
		co_ctx[i].uc_link = &co_main;
		makecontext(&co_ctx[i], (void (*)(void))co_body, 1, i);
	}
	for (int round = 0; round < 4; round++) {
		evict_buf();
		for (int i = 0; i < COROUTINES; i++)
			swapcontext(&co_main, &co_ctx[i]);
	}
	for (int i = 0; i < COROUTINES; i++)
		if (co_sum[i] != co_want(i))
			FAIL("coroutine %d on a stack of paged memory summed %llu, not %llu", i,
			     (unsigned long long)co_sum[i], (unsigned long long)co_want(i));

	pthread_attr_init(&attr);
	pthread_attr_setstack(&attr, stacks + COROUTINES * CO_STACK, 2u << 20);
	if (pthread_create(&th, &attr, own_stack_worker, stacks) || pthread_join(th, &back) || back != stacks)
		FAIL("a thread on a stack of paged memory did not run to its end");
	pthread_attr_destroy(&attr);

	{
		int fd = temp_file(NULL, 0);
		void *top = stacks + COROUTINES * CO_STACK + (11u << 20); /* 2 MiB below it, apart from the rest */

		if (ftruncate(fd, 4321))
			FAIL("ftruncate: %s", strerror(errno));
		/* By name: the linker warns of every use of the old call, and this one is meant. */
		int (*setstackaddr)(pthread_attr_t *, void *) =
			(int (*)(pthread_attr_t *, void *))dlsym(RTLD_DEFAULT, "pthread_attr_setstackaddr");

		pthread_attr_init(&attr);
		if (!setstackaddr || setstackaddr(&attr, top) || pthread_attr_setstacksize(&attr, 2u << 20))
			FAIL("pthread_attr_setstackaddr: not there or refused");
		evict_buf();
		back = (void *)1;
		if (pthread_create(&th, &attr, top_only_stack_worker, &fd) || pthread_join(th, &back) || back)
			FAIL("a thread on a stack given by pthread_attr_setstackaddr: fstat into its frame: %s",
			     back == (void *)(intptr_t)-1 ? "wrong size" : strerror((int)(intptr_t)back));
		pthread_attr_destroy(&attr);
		close(fd);
	}

	evict_buf();
	sigemptyset(&sa.sa_mask);
	if (sigaltstack(&alt, NULL) || sigaction(SIGUSR1, &sa, NULL)) {
		FAIL("sigaltstack: %s", strerror(errno));
		return;
	}
	raise(SIGUSR1);
	if (alt_ran != SIGUSR1 + 100)
		FAIL("a handler on an alternate stack of paged memory did not run");
	alt.ss_flags = SS_DISABLE;
	sigaltstack(&alt, NULL);
}

/*
 * A stack the program switches to by its own assembly, as Erlang's JIT does
 * (each Erlang process's stack lives in its heap) and coroutine libraries
 * do: no call the shim sees hands it over, so it stays paged. Faults taken
 * there, and the evictions they cause, run on the pager's own stack: before
 * session 34 the kernel could not write the signal's frame on an evicted
 * page of it (SIGSEGV), and the handler's frames went onto pages it evicts.
 */
#if defined(__x86_64__)
static void on_own_stack(void (*fn)(void), void *top)
{
	__asm__ volatile("mov %%rsp, %%rbx\n\t"
			 "mov %1, %%rsp\n\t"
			 "call *%0\n\t"
			 "mov %%rbx, %%rsp\n\t"
			 :
			 : "r"(fn), "r"(top)
			 : "rbx", "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0", "xmm1", "xmm2",
			   "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",
			   "xmm14", "xmm15", "memory", "cc");
}
#endif

static void own_stack_body(void)
{
	volatile uint8_t frame[3 * PAGE]; /* the body's own frame spans pages of the paged stack */

	for (int round = 0; round < 3; round++) {
		for (size_t i = 0; i < sizeof(frame); i++)
			frame[i] = (uint8_t)(i * 7 + (size_t)round);
		fill(buf + CHUNK, CHUNK, CHUNK, (unsigned)(51 + round));
		evict_buf();
		check(buf + CHUNK, CHUNK, CHUNK, (unsigned)(51 + round), "paged memory read from a stack of paged memory");
		for (size_t i = 0; i < sizeof(frame); i++)
			if (frame[i] != (uint8_t)(i * 7 + (size_t)round)) {
				FAIL("a stack of paged memory lost byte %zu of its frame", i);
				return;
			}
	}
	/*
	 * A mapping made and unmapped from here, the stack's pages below out:
	 * the pager's frames for it ran onto them while it held its region lock
	 * for writing, and their fault found the lock taken (SBCL, whose Lisp
	 * runs on a control stack it maps itself, before session 38).
	 */
	evict_buf();
	uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		FAIL("mmap from a stack of paged memory: %s", strerror(errno));
		return;
	}
	m[0] = 1;
	m[size - 1] = 2;
	if (madvise(m, PAGE, MADV_DONTNEED) || m[0] || m[size - 1] != 2 || mprotect(m, PAGE, PROT_READ) ||
	    munmap(m, size))
		FAIL("a mapping made from a stack of paged memory: %s", strerror(errno));
	/*
	 * The same through the malloc family: a block of its own mapping is
	 * registered, grown in place or moved, and unregistered by the pager
	 * under the same lock (the mmap family's calls alone left here before
	 * session 39).
	 */
	evict_buf();
	uint8_t *b = malloc(size);
	if (!b) {
		FAIL("malloc from a stack of paged memory: %s", strerror(errno));
		return;
	}
	b[0] = 3;
	b[size - 1] = 4;
	evict_buf();
	uint8_t *g = realloc(b, size + size / 2);
	if (!g || g[0] != 3 || g[size - 1] != 4) {
		FAIL("realloc from a stack of paged memory lost the block's bytes");
		free(g ? g : b);
		return;
	}
	g[size + size / 2 - 1] = 5;
	evict_buf();
	free(g);
	uint8_t *z = calloc(1, size);
	if (!z || z[size - 1]) {
		FAIL("calloc from a stack of paged memory: %s", z ? "not zero" : strerror(errno));
		return;
	}
	free(z);
	/*
	 * A read from here of 24 MiB into evicted paged memory, the budget full
	 * of other pages: with faults served in this thread the read's pages are
	 * made resident first, in this thread, evicting as they come, and the
	 * pages that leave may be this stack's (it passed before session 39
	 * too, when that work ran on this stack: a guard).
	 */
	size_t part = 3 * size / 8;
	uint8_t *src = malloc(part);
	if (!src) {
		FAIL("malloc: %s", strerror(errno));
		return;
	}
	fill(src, part, 0, 57);
	int fd = temp_file(src, part);
	free(src);
	for (int round = 0; round < 2 && !failed; round++) {
		evict_buf();
		if (pread(fd, buf, part, 0) != (ssize_t)part)
			FAIL("a read from a stack of paged memory: %s", strerror(errno));
		else
			check(buf, part, 0, 57, "a read from a stack of paged memory");
	}
	close(fd);
}

#if defined(__x86_64__)
static void *own_stack_first(void *top)
{
	/* Nothing paged touched before: this thread's first fault is on the evicted stack. */
	on_own_stack(own_stack_body, top);
	return top;
}
#endif

static void t_ownstack(void)
{
#if defined(__x86_64__)
	/* 1 MiB of the buffer, its top 16-byte aligned; what was there is not needed by this part. */
	uint8_t *top = buf + 3 * size / 8 + (1u << 20);
	pthread_t th;
	void *back = NULL;

	evict_buf(); /* the stack's pages are out before it is switched to */
	on_own_stack(own_stack_body, top);
	/* A new thread whose very first fault comes there: it died of SIGSEGV before session 35. */
	evict_buf();
	if (pthread_create(&th, NULL, own_stack_first, top) || pthread_join(th, &back) || back != top)
		FAIL("a thread whose first fault is on a stack of paged memory did not run to its end");
#endif
}

/*
 * Threads that end by pthread_exit or by cancellation, one after another,
 * each after a fault on an evicted page: the shim gives each one's stack of
 * farmem's back to the pool as it ends (the pthread_exit and cancellation
 * ends left theirs to be found by a tgkill scan at the next thread's start
 * before session 36; tests/test_fault_path.py counts those system calls).
 */
#define EXIT_THREADS 200

static void *exit_worker(void *arg)
{
	size_t i = (size_t)(uintptr_t)arg;
	const uint8_t *page = buf + 8 * CHUNK + i * PAGE;

	if (check(page, PAGE, i * PAGE, 61, "a page read by a thread that ends by pthread_exit or cancellation"))
		return NULL;
	if (i % 2 == 0)
		pthread_exit(arg);
	for (;;)
		pthread_testcancel(); /* its creator cancels it */
	return NULL;
}

static void t_exits(void)
{
	fill(buf + 8 * CHUNK, EXIT_THREADS * PAGE, 0, 61);
	for (size_t i = 0; i < EXIT_THREADS && !failed; i++) {
		pthread_t th;
		void *back = NULL;

		if (i % 50 == 0)
			evict_buf();
		if (pthread_create(&th, NULL, exit_worker, (void *)(uintptr_t)i)) {
			FAIL("exits: pthread_create: %s", strerror(errno));
			return;
		}
		if (i % 2)
			pthread_cancel(th);
		pthread_join(th, &back);
		if (back != (i % 2 ? PTHREAD_CANCELED : (void *)(uintptr_t)i) && !failed)
			FAIL("exits: thread %zu ended with %p", i, back);
	}
}

/*
 * The waits for descriptors with their arrays in evicted paged memory: the
 * kernel reads them and writes its answers there (epoll_wait's events,
 * poll's revents, select's fd sets), and cannot wait for a page with faults
 * served in the faulting thread: each failed with EFAULT before session 34
 * (Erlang's poll thread: "erts_poll_wait() failed: efault", and it hung).
 */
static void t_poll(void)
{
	int sv[2], ep;
	struct epoll_event ev = { .events = EPOLLIN };
	struct epoll_event *evs = (struct epoll_event *)(buf + 5 * CHUNK + 3 * PAGE);
	struct pollfd *pf = (struct pollfd *)(buf + 6 * CHUNK + 5 * PAGE);
	fd_set *rs = (fd_set *)(buf + 7 * CHUNK + 2 * PAGE);
	struct timespec zero = { 0 };
	sigset_t none;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) || write(sv[1], "x", 1) != 1 || (ep = epoll_create1(0)) < 0) {
		FAIL("poll: setup: %s", strerror(errno));
		return;
	}
	ev.data.u64 = 0x5ca1ab1e;
	epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev);
	sigemptyset(&none);
	for (int kind = 0; kind < 6; kind++) {
		static const char *const names[] = { "epoll_wait", "epoll_pwait", "poll", "ppoll", "select", "pselect" };
		int r = -1;

		evict_buf();
		switch (kind) {
		case 0:
			r = epoll_wait(ep, evs, 64, 1000);
			break;
		case 1:
			r = epoll_pwait(ep, evs, 64, 1000, &none);
			break;
		case 2:
		case 3:
			pf[0] = (struct pollfd){ .fd = sv[0], .events = POLLIN };
			pf[1] = (struct pollfd){ .fd = sv[1], .events = POLLIN };
			evict_buf();
			r = kind == 2 ? poll(pf, 2, 1000) : ppoll(pf, 2, NULL, &none);
			break;
		default:
			FD_ZERO(rs);
			FD_SET(sv[0], rs);
			FD_SET(sv[1], rs);
			evict_buf();
			r = kind == 4 ? select(sv[1] + 1, rs, NULL, NULL, NULL) : pselect(sv[1] + 1, rs, NULL, NULL, &zero, &none);
			break;
		}
		if (r != 1)
			FAIL("%s with its array in evicted paged memory returned %d (%s), not 1", names[kind], r,
			     r < 0 ? strerror(errno) : "no error");
		else if (kind < 2 && (evs[0].data.u64 != 0x5ca1ab1e || !(evs[0].events & EPOLLIN)))
			FAIL("%s wrote the wrong event", names[kind]);
		else if ((kind == 2 || kind == 3) && (!(pf[0].revents & POLLIN) || (pf[1].revents & POLLIN)))
			FAIL("%s wrote the wrong revents", names[kind]);
		else if (kind >= 4 && (!FD_ISSET(sv[0], rs) || FD_ISSET(sv[1], rs)))
			FAIL("%s wrote the wrong fd set", names[kind]);
	}
	close(ep);
	close(sv[0]);
	close(sv[1]);
}

/*
 * Starting a program whose path, arguments and environment lie in evicted
 * paged memory (a program's argument table in a big block): the kernel
 * copies them at exec, and with faults served in the faulting thread it
 * cannot wait for a page (EFAULT before session 45). Each way runs sh,
 * which exits 0 only if its argument and its environment arrived whole.
 */
static char *exec_str(size_t *at, const char *s)
{
	char *d = (char *)buf + *at;

	strcpy(d, s);
	*at += PAGE; /* a page each: the kernel meets one evicted page after another */
	return d;
}

static void exec_check(const char *how, int status)
{
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		FAIL("exec: %s with its strings in evicted paged memory: status %#x%s", how, status,
		     WIFEXITED(status) && WEXITSTATUS(status) == EFAULT ? " (EFAULT)" : "");
}

/* The child's exit status; the child runs on this frame until its exec, so nothing here lives past the vfork. */
static __attribute__((noinline)) int vfork_exec(int way, char *path, char **argv, char **envp, char *val)
{
	pid_t pid = vfork();
	int status = -1;

	if (pid == 0) {
		if (way == 2)
			execve(path, argv, envp);
		else if (way == 3)
			execvpe(argv[0], argv, envp);
		else if (way == 4)
			execle(path, argv[0], argv[1], argv[2], argv[3], argv[4], (char *)NULL, envp);
		else if (putenv(val) == 0)
			execl(path, argv[0], argv[1], argv[2], argv[3], argv[4], (char *)NULL);
		_exit(errno);
	}
	if (pid > 0)
		waitpid(pid, &status, 0);
	return status;
}

static void t_exec(void)
{
	size_t at = 9 * CHUNK;
	char **argv = (char **)(buf + at), **envp = argv + 8;
	char *sh, *path, *cmd, *val, line[64] = { 0 };
	pid_t pid;
	int status, rc;
	FILE *fp;

	at += PAGE;
	sh = exec_str(&at, "sh");
	path = exec_str(&at, "/bin/sh");
	argv[0] = sh;
	argv[1] = exec_str(&at, "-c");
	argv[2] = exec_str(&at, "test \"$1\" = paged-argument && test \"$IOTEST_EXEC\" = paged-environment");
	argv[3] = sh;
	argv[4] = exec_str(&at, "paged-argument");
	argv[5] = NULL;
	envp[0] = val = exec_str(&at, "IOTEST_EXEC=paged-environment");
	envp[1] = NULL;
	cmd = exec_str(&at, "test \"$(echo paged-command)\" = paged-command && echo paged-output");

	for (int way = 0; way < 7; way++) {
		static const char *const names[] = { "posix_spawn", "posix_spawnp", "vfork+execve", "vfork+execvpe",
						     "vfork+execle", "vfork+execl", "system" };

		evict_buf();
		status = -1;
		switch (way) {
		case 0:
		case 1:
			rc = way ? posix_spawnp(&pid, sh, NULL, NULL, argv, envp) : posix_spawn(&pid, path, NULL, NULL, argv, envp);
			if (rc) {
				FAIL("exec: %s: %s", names[way], strerror(rc));
				continue;
			}
			waitpid(pid, &status, 0);
			break;
		case 6:
			setenv("IOTEST_EXEC", "paged-environment", 1);
			status = system(cmd);
			unsetenv("IOTEST_EXEC");
			break;
		default:
			status = vfork_exec(way, path, argv, envp, val);
			break;
		}
		exec_check(names[way], status);
	}
	{
		/* A shell that ran and exited 127 is not run again, whatever errno held before. */
		char once[] = "/tmp/iotest-once-XXXXXX", run[128], got[8] = { 0 };
		int fd = mkstemp(once);

		snprintf(run, sizeof(run), "echo ran >> %s; exit 127", once);
		errno = EFAULT;
		status = system(run);
		if (fd < 0 || pread(fd, got, sizeof(got) - 1, 0) < 0 || strcmp(got, "ran\n"))
			FAIL("exec: system of a shell that exits 127 ran it %s (status %#x)", strcmp(got, "ran\n") ? "again" : "?", status);
		if (fd >= 0) {
			close(fd);
			unlink(once);
		}
	}
	evict_buf();
	fp = popen(cmd, "r");
	if (!fp || !fgets(line, sizeof(line), fp) || strcmp(line, "paged-output\n"))
		FAIL("exec: popen with its command in evicted paged memory: %s", fp ? line : strerror(errno));
	if (fp && (status = pclose(fp)))
		exec_check("popen", status);
}

/*
 * A daemon's way of starting clean: close every descriptor but 0-2, by a loop
 * up to the limit, close_range and closefrom. The pager's userfaultfd, memd
 * connections and pipes must survive it, and a file the program opens next
 * (on a number one of them may have had) must hold only what it wrote.
 */
static void t_close(void)
{
	static const char line[] = "only this\n";
	char back[64] = { 0 };
	int fd;

	fill(buf, 4 * CHUNK, 0, 47);
	for (int k = 3; k < 1024; k++)
		close(k);
	close_range(3, ~0u, 0);
	closefrom(3);
	fd = open("/tmp", O_TMPFILE | O_RDWR, 0600);
	if (fd < 0) {
		FAIL("close: a file after closing everything: %s", strerror(errno));
		return;
	}
	if (write(fd, line, sizeof(line) - 1) != (ssize_t)sizeof(line) - 1)
		FAIL("close: write: %s", strerror(errno));
	/* Every other number made a copy of the file, and closed again: farmem's refuse (EBUSY). */
	for (int k = 3, busy = 0; k < 1024 + 1; k++) {
		if (k == 1024) {
			printf("iotest: close: %d dup2s onto farmem's descriptors refused\n", busy);
			break;
		}
		if (k != fd && (k & 1 ? dup2(fd, k) : dup3(fd, k, O_CLOEXEC)) < 0) {
			if (errno != EBUSY)
				FAIL("close: dup2 onto %d: %s", k, strerror(errno));
			busy++;
		}
	}
	for (int k = 3; k < 1024; k++)
		if (k != fd)
			close(k);
	evict_buf();
	check(buf, 4 * CHUNK, 0, 47, "paging after every descriptor was closed");
	fill(buf + 4 * CHUNK, 4 * CHUNK, 0, 53);
	evict_buf();
	check(buf + 4 * CHUNK, 4 * CHUNK, 0, 53, "paging after every descriptor was closed");
	if (pread(fd, back, sizeof(back) - 1, 0) != (ssize_t)sizeof(line) - 1 || strcmp(back, line))
		FAIL("close: the program's file holds %zu bytes, not only its own line", strlen(back));
	close(fd);
}

static void t_protect(void)
{
	uint8_t *at = buf + size / 2 + 256 * PAGE;
	size_t n = 64 * PAGE;

	fill(at, n, 0, 29);
	if (mprotect(at, n, PROT_NONE)) {
		FAIL("protect: mprotect: %s", strerror(errno));
		return;
	}
	evict_buf();
	evict_buf();
	if (mprotect(at, n, PROT_READ | PROT_WRITE))
		FAIL("protect: mprotect back: %s", strerror(errno));
	else
		check(at, n, 0, 29, "a range made PROT_NONE and back");
	fill(at, n, (uint64_t)(at - buf), 1); /* as main left it */
}

static int cancel_fds[2];

static void *cancel_reader(void *arg)
{
	if (read(cancel_fds[0], arg, 64) >= 0)
		FAIL("cancel: the read returned: nothing was written to the pipe");
	return NULL;
}

static void *cancel_waiter(void *arg)
{
	sem_wait(arg);
	return NULL;
}

/* More than the sync crowd's 100 at once: pins not given back would add up to a peak_pins above it. */
#define CANCEL_ROUNDS 1100

static void t_cancel(void)
{
	sem_t *sem = (sem_t *)(buf + size / 2 + 200 * PAGE);
	int cancelled = 0;

	if (pipe(cancel_fds)) {
		FAIL("cancel: pipe: %s", strerror(errno));
		return;
	}
	sem_init(sem, 0, 0);
	for (int k = 0; k < CANCEL_ROUNDS; k++) {
		pthread_t th;
		void *r;

		pthread_create(&th, NULL, k % 2 ? cancel_waiter : cancel_reader,
			       k % 2 ? (void *)sem : (void *)(buf + size / 2 + 210 * PAGE + 7));
		usleep(2000);
		pthread_cancel(th);
		pthread_join(th, &r);
		cancelled += r == PTHREAD_CANCELED;
	}
	if (cancelled != CANCEL_ROUNDS)
		FAIL("cancel: %d of %d threads were cancelled", cancelled, CANCEL_ROUNDS);
	sem_destroy(sem);
	close(cancel_fds[0]);
	close(cancel_fds[1]);
}

#define SYNC_PAIRS 4
#define SYNC_ROUNDS 20000

/* One producer and one consumer, on their own page of paged memory. */
struct sync_pair {
	sem_t empty, full;
	pthread_mutex_t m;
	pthread_cond_t c;
	pthread_rwlock_t rw;
	long posted, taken, sum, shared;
};

static pthread_barrier_t *sync_barrier;
static atomic_int sync_stop;

static void sync_deadline(struct timespec *t)
{
	clock_gettime(CLOCK_REALTIME, t);
	t->tv_sec += 60;
}

static void *sync_producer(void *arg)
{
	struct sync_pair *s = arg;
	struct timespec t;

	for (long i = 1; i <= SYNC_ROUNDS; i++) {
		sync_deadline(&t);
		if (i % 2 ? sem_wait(&s->empty) : sem_timedwait(&s->empty, &t))
			FAIL("sync: sem_wait: %s", strerror(errno));
		pthread_rwlock_wrlock(&s->rw);
		s->shared = i;
		pthread_rwlock_unlock(&s->rw);
		pthread_mutex_lock(&s->m);
		s->posted = i;
		pthread_cond_signal(&s->c);
		pthread_mutex_unlock(&s->m);
		sem_post(&s->full);
		if (i % 1000 == 0)
			pthread_barrier_wait(sync_barrier);
	}
	return NULL;
}

static void *sync_consumer(void *arg)
{
	struct sync_pair *s = arg;
	struct timespec t;

	for (long i = 1; i <= SYNC_ROUNDS; i++) {
		sync_deadline(&t);
		if (i % 2 ? sem_timedwait(&s->full, &t) : sem_wait(&s->full))
			FAIL("sync: sem_timedwait: %s", strerror(errno));
		pthread_mutex_lock(&s->m);
		while (s->posted < i)
			if (i % 2)
				pthread_cond_wait(&s->c, &s->m);
			else
				pthread_cond_timedwait(&s->c, &s->m, &t);
		s->taken = i;
		pthread_mutex_unlock(&s->m);
		pthread_rwlock_rdlock(&s->rw);
		s->sum += s->shared;
		pthread_rwlock_unlock(&s->rw);
		sem_post(&s->empty);
		if (i % 1000 == 0)
			pthread_barrier_wait(sync_barrier);
	}
	return NULL;
}

static void *sync_evictor(void *arg)
{
	(void)arg;
	while (!atomic_load(&sync_stop))
		evict_buf();
	return NULL;
}

static struct sync_pair *sync_pair_at(uint8_t *at, int k)
{
	return (struct sync_pair *)(at + (size_t)(k + 1) * 16 * PAGE);
}

/*
 * Each kind of wait, on an object alone on its page: a thread sleeps in it
 * while this one evicts, and mincore says whether the page stayed. With
 * faults served in the faulting thread the shim pins it for the wait.
 */
enum { W_SEM, W_SEM_TIMED, W_COND, W_COND_TIMED, W_MUTEX, W_RWLOCK, W_BARRIER, W_KINDS };

struct sync_waiter {
	int kind;
	atomic_int tid;
	uint8_t *page;
};

struct sync_cv {
	pthread_mutex_t m;
	pthread_cond_t c;
	int go;
};

static void *sync_wait(void *arg)
{
	struct sync_waiter *w = arg;
	struct sync_cv *cv = (struct sync_cv *)w->page;
	struct timespec t;

	sync_deadline(&t);
	atomic_store(&w->tid, (int)syscall(SYS_gettid));
	switch (w->kind) {
	case W_SEM:
		sem_wait((sem_t *)w->page);
		break;
	case W_SEM_TIMED:
		sem_timedwait((sem_t *)w->page, &t);
		break;
	case W_COND:
	case W_COND_TIMED:
		pthread_mutex_lock(&cv->m);
		while (!cv->go)
			if (w->kind == W_COND)
				pthread_cond_wait(&cv->c, &cv->m);
			else
				pthread_cond_timedwait(&cv->c, &cv->m, &t);
		pthread_mutex_unlock(&cv->m);
		break;
	case W_MUTEX:
		pthread_mutex_lock((pthread_mutex_t *)w->page);
		pthread_mutex_unlock((pthread_mutex_t *)w->page);
		break;
	case W_RWLOCK:
		pthread_rwlock_wrlock((pthread_rwlock_t *)w->page);
		pthread_rwlock_unlock((pthread_rwlock_t *)w->page);
		break;
	case W_BARRIER:
		pthread_barrier_wait((pthread_barrier_t *)w->page);
		break;
	}
	return NULL;
}

/* Until the thread sleeps in the kernel (state S), at most 5 s. */
static void sync_asleep(struct sync_waiter *w)
{
	for (int k = 0; k < 500; k++) {
		char path[64], line[256], *close_paren;
		FILE *f;
		int tid = atomic_load(&w->tid);

		usleep(10000);
		if (!tid)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
		f = fopen(path, "r");
		if (!f)
			continue;
		close_paren = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
		fclose(f);
		if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'S')
			return;
	}
}

static int sync_held(int kind, uint8_t *page)
{
	struct sync_waiter w = { .kind = kind, .page = page };
	struct sync_cv *cv = (struct sync_cv *)page;
	pthread_t th;
	unsigned char vec = 0;

	memset(page, 0, PAGE);
	if (kind == W_SEM || kind == W_SEM_TIMED)
		sem_init((sem_t *)page, 0, 0);
	if (kind == W_COND || kind == W_COND_TIMED) {
		pthread_mutex_init(&cv->m, NULL);
		pthread_cond_init(&cv->c, NULL);
	}
	if (kind == W_MUTEX) {
		pthread_mutex_init((pthread_mutex_t *)page, NULL);
		pthread_mutex_lock((pthread_mutex_t *)page);
	}
	if (kind == W_RWLOCK) {
		pthread_rwlock_init((pthread_rwlock_t *)page, NULL);
		pthread_rwlock_rdlock((pthread_rwlock_t *)page);
	}
	if (kind == W_BARRIER)
		pthread_barrier_init((pthread_barrier_t *)page, NULL, 2);
	pthread_create(&th, NULL, sync_wait, &w);
	sync_asleep(&w);
	evict_buf();
	evict_buf();
	if (mincore(page, PAGE, &vec))
		FAIL("sync: mincore: %s", strerror(errno));
	switch (kind) {
	case W_SEM:
	case W_SEM_TIMED:
		sem_post((sem_t *)page);
		break;
	case W_COND:
	case W_COND_TIMED:
		pthread_mutex_lock(&cv->m);
		cv->go = 1;
		pthread_cond_signal(&cv->c);
		pthread_mutex_unlock(&cv->m);
		break;
	case W_MUTEX:
		pthread_mutex_unlock((pthread_mutex_t *)page);
		break;
	case W_RWLOCK:
		pthread_rwlock_unlock((pthread_rwlock_t *)page);
		break;
	case W_BARRIER:
		pthread_barrier_wait((pthread_barrier_t *)page);
		break;
	}
	pthread_join(th, NULL);
	return vec & 1;
}

/*
 * More sleepers at once than the pin table once held (64): a thread pool's
 * workers, each waiting on a semaphore of its own in paged memory. With
 * fault=signal every page must stay (an unpinned one could be evicted between
 * glibc's read of the futex word and the kernel's, and the wait abort).
 */
#define SYNC_CROWD 100

static void sync_crowd(uint8_t *at)
{
	static struct sync_waiter w[SYNC_CROWD];
	pthread_t th[SYNC_CROWD];
	unsigned char vec[SYNC_CROWD];
	int held = 0;

	for (int k = 0; k < SYNC_CROWD; k++) {
		w[k] = (struct sync_waiter){ .kind = W_SEM, .page = at + (size_t)k * PAGE };
		memset(w[k].page, 0, PAGE);
		sem_init((sem_t *)w[k].page, 0, 0);
		if (pthread_create(&th[k], NULL, sync_wait, &w[k]))
			FAIL("sync: pthread_create: %s", strerror(errno));
	}
	for (int k = 0; k < SYNC_CROWD; k++)
		sync_asleep(&w[k]);
	evict_buf();
	evict_buf();
	if (mincore(at, SYNC_CROWD * PAGE, vec))
		FAIL("sync: mincore: %s", strerror(errno));
	for (int k = 0; k < SYNC_CROWD; k++) {
		held += vec[k] & 1;
		sem_post((sem_t *)w[k].page);
	}
	for (int k = 0; k < SYNC_CROWD; k++)
		pthread_join(th[k], NULL);
	printf("iotest: sync: %d of %d sleepers at once kept their page\n", held, SYNC_CROWD);
}

static void t_sync(void)
{
	pthread_t th[2 * SYNC_PAIRS], ev;
	uint8_t *at = buf + size / 2;

	/* Each object on its own page, apart from what the other checks use. */
	sync_barrier = (pthread_barrier_t *)at;
	pthread_barrier_init(sync_barrier, NULL, 2 * SYNC_PAIRS);
	for (int k = 0; k < SYNC_PAIRS; k++) {
		struct sync_pair *s = sync_pair_at(at, k);
		memset(s, 0, sizeof(*s));
		sem_init(&s->empty, 0, 1);
		sem_init(&s->full, 0, 0);
		pthread_mutex_init(&s->m, NULL);
		pthread_cond_init(&s->c, NULL);
		pthread_rwlock_init(&s->rw, NULL);
		pthread_create(&th[2 * k], NULL, sync_producer, s);
		pthread_create(&th[2 * k + 1], NULL, sync_consumer, s);
	}
	pthread_create(&ev, NULL, sync_evictor, NULL);
	for (int k = 0; k < 2 * SYNC_PAIRS; k++)
		pthread_join(th[k], NULL);
	atomic_store(&sync_stop, 1);
	pthread_join(ev, NULL);
	for (int k = 0; k < SYNC_PAIRS; k++) {
		struct sync_pair *s = sync_pair_at(at, k);
		long want = (long)SYNC_ROUNDS * (SYNC_ROUNDS + 1) / 2;
		if (s->sum != want || s->taken != SYNC_ROUNDS)
			FAIL("sync: pair %d: sum %ld after %ld rounds, expected %ld after %d", k, s->sum, s->taken,
			     want, SYNC_ROUNDS);
		pthread_cond_destroy(&s->c);
		pthread_rwlock_destroy(&s->rw);
		pthread_mutex_destroy(&s->m);
		sem_destroy(&s->empty);
		sem_destroy(&s->full);
	}
	pthread_barrier_destroy(sync_barrier);

	int held = 0;
	for (int kind = 0; kind < W_KINDS; kind++)
		held += sync_held(kind, at + (size_t)(SYNC_PAIRS + 2 + kind) * 16 * PAGE);
	/* fault=signal: all of them (the pins); fault=thread: the kernel waits, nothing is pinned. */
	printf("iotest: sync: %d of %d waits kept their page\n", held, W_KINDS);
	sync_crowd(at + 256 * PAGE);
}

/* This process's registered pages, by its own residency map (0 before the pager started). */
static uint64_t registered_pages(void)
{
	static const struct fm_resmap_hdr *map;

	if (!map)
		map = fm_resmap_self();
	return map ? __atomic_load_n(&map->stats.registered_pages, __ATOMIC_RELAXED) : 0;
}

static void t_syscall(void)
{
	uint8_t *src = malloc(CHUNK), *m;
	uint64_t before = registered_pages(), during;
	struct timespec wait = { 0, 20 * 1000 * 1000 };
	uint32_t *word;
	uint64_t *set;
	int fd;
	long n;

	m = (uint8_t *)syscall(SYS_mmap, NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		FAIL("syscall(SYS_mmap): %s", strerror(errno));
		return;
	}
	during = registered_pages();
	if (during < before + size / PAGE)
		FAIL("syscall: a mapping made by syscall(SYS_mmap) is not paged (%llu pages registered, %llu before)",
		     (unsigned long long)during, (unsigned long long)before);
	fill(m, size, 0, 31);
	evict_buf();
	/* Dropped while evicted: the pager must hear of it, or the page comes back from memd with old bytes. */
	if (syscall(SYS_madvise, m + 64 * PAGE, 16 * PAGE, MADV_DONTNEED))
		FAIL("syscall(SYS_madvise): %s", strerror(errno));
	for (size_t i = 64 * PAGE; i < 80 * PAGE; i++)
		if (m[i]) {
			FAIL("syscall: byte %zu dropped by syscall(SYS_madvise, MADV_DONTNEED) reads %#x, not 0", i, m[i]);
			break;
		}
	if (!check(m, 64 * PAGE, 0, 31, "syscall mmap (before the dropped pages)"))
		check(m + 80 * PAGE, size - 80 * PAGE, 80 * PAGE, 31, "syscall mmap (after the dropped pages)");
	/* The same in the buffer, which mmap() mapped: syscall(SYS_madvise) is seen whoever mapped the range. */
	fill(buf + size / 2, 16 * PAGE, 0, 34);
	evict_buf();
	if (syscall(SYS_madvise, buf + size / 2, 16 * PAGE, MADV_DONTNEED))
		FAIL("syscall(SYS_madvise): %s", strerror(errno));
	for (size_t i = 0; i < 16 * PAGE; i++)
		if (buf[size / 2 + i]) {
			FAIL("syscall: byte %zu of the buffer dropped by syscall(SYS_madvise) reads %#x, not 0", i,
			     buf[size / 2 + i]);
			break;
		}

	fill(src, CHUNK, 0, 32);
	fd = temp_file(src, CHUNK);
	evict_buf();
	n = syscall(SYS_pread64, fd, buf + 16 * PAGE, CHUNK, 0);
	if (n != (long)CHUNK)
		FAIL("syscall(SYS_pread64) into the evicted buffer: %ld (%s)", n, strerror(errno));
	else
		check(buf + 16 * PAGE, CHUNK, 0, 32, "syscall pread64");
	fill(src, CHUNK, 0, 33);
	if (pwrite(fd, src, CHUNK, 0) != (ssize_t)CHUNK || lseek(fd, 0, SEEK_SET))
		FAIL("syscall: rewriting the temporary file: %s", strerror(errno));
	evict_buf();
	n = syscall(SYS_read, fd, buf + 16 * PAGE, CHUNK);
	if (n != (long)CHUNK)
		FAIL("syscall(SYS_read) into the evicted buffer: %ld (%s)", n, strerror(errno));
	else
		check(buf + 16 * PAGE, CHUNK, 0, 33, "syscall read");
	close(fd);

	/* The kernel reads the word to compare it: evicted, that read fails with EFAULT unless the word is pinned. */
	word = (uint32_t *)(buf + size / 2 + 32 * PAGE);
	*word = 7;
	evict_buf();
	n = syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 7, &wait, NULL, 0);
	if (n != -1 || errno != ETIMEDOUT)
		FAIL("syscall(SYS_futex, FUTEX_WAIT) on an evicted word: %ld (%s), not a timeout", n, strerror(errno));

	/* Any other number: the kernel reads what an argument points at (an empty set: blocks nothing). */
	set = (uint64_t *)(buf + size / 2 + 48 * PAGE);
	*set = 0;
	evict_buf();
	if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, set, NULL, sizeof(*set)))
		FAIL("syscall(SYS_rt_sigprocmask) with its set evicted: %s", strerror(errno));

	if (syscall(SYS_munmap, m, size))
		FAIL("syscall(SYS_munmap): %s", strerror(errno));
	if (registered_pages() > during - size / PAGE)
		FAIL("syscall: syscall(SYS_munmap) left the mapping's pages registered (%llu, %llu with it)",
		     (unsigned long long)registered_pages(), (unsigned long long)during);
	free(src);
}

static void t_raw(void)
{
	uint8_t *src = malloc(CHUNK);
	int fd;
	long n;

	fill(src, CHUNK, 0, 21);
	fd = temp_file(src, CHUNK);
	evict_buf();
	/* The syscall instruction itself: what no cover sees. */
	n = fm_raw_syscall6(SYS_pread64, fd, (long)(buf + 16 * PAGE), CHUNK, 0, 0, 0);
	if (n < 0 && errno == EFAULT)
		printf("raw: efault\n");
	else if (n == (long)CHUNK && !check(buf + 16 * PAGE, CHUNK, 0, 21, "raw pread"))
		printf("raw: ok\n");
	else
		FAIL("raw pread: %ld (%s)", n, strerror(errno));
	close(fd);
	free(src);
}

static int parse_nonzero_size(const char *s, size_t *out)
{
	uint64_t v;

	if (parse_size(s, &v) || !v)
		return -1;
	*out = (size_t)v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct { const char *name; void (*fn)(void); } tests[] = {
		{ "read", t_read }, { "write", t_write }, { "stdio", t_stdio }, { "fortify", t_fortify }, { "big", t_big }, { "socket", t_socket },
		{ "sigbus", t_sigbus }, { "blocked", t_blocked }, { "protect", t_protect }, { "cancel", t_cancel }, { "sync", t_sync }, { "stacks", t_stacks }, { "ownstack", t_ownstack }, { "exits", t_exits }, { "poll", t_poll }, { "exec", t_exec }, { "close", t_close },
		{ "syscall", t_syscall }, { "raw", t_raw },
	};
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "pressure", required_argument, NULL, 'p' },
		{ "only", required_argument, NULL, 'o' },
		{ 0 },
	};
	const char *only = NULL;
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 's' && !parse_nonzero_size(optarg, &size))
			continue;
		if (c == 'p' && !parse_nonzero_size(optarg, &pressure_size))
			continue;
		if (c == 'o') {
			only = optarg;
			continue;
		}
		fprintf(stderr, "usage: iotest [--size 128M] [--pressure 256M] [--only NAME]\n");
		return 2;
	}
	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pressure = mmap(NULL, pressure_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED || pressure == MAP_FAILED) {
		perror("iotest: mmap");
		return 1;
	}
	fill(buf, size, 0, 1);
	for (size_t k = 0; k < sizeof(tests) / sizeof(tests[0]); k++) {
		if (only ? strcmp(only, tests[k].name) : tests[k].fn == t_raw)
			continue;
		tests[k].fn();
		printf("iotest: %s %s\n", tests[k].name, failed ? "FAILED" : "ok");
		if (failed)
			return 1;
	}
	return 0;
}
