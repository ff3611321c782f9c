// SPDX-License-Identifier: Apache-2.0
/*
 * The shim's covers for system calls on paged memory, and for SIGBUS.
 *
 * With faults served in the faulting thread (fault=signal), the kernel
 * cannot wait for a page that a system call touches: the call fails with
 * EFAULT. So the calls that move data between the kernel and a buffer make
 * the buffer resident (writable, when the kernel writes it) and pin it for
 * the call (fm_pager_io_begin); a call that still fails with EFAULT on paged
 * memory is made again. Calls outside paged memory cost one bounds check.
 * The call itself is libc's, so that it stays a cancellation point; a
 * thread cancelled in it gives its pins back.
 * stdio's fread and fwrite are covered too: a large request goes straight
 * between the kernel and the caller's buffer through glibc's own read and
 * write, which no cover sees. What is not covered: raw system calls (the
 * program's own `syscall` instruction; glibc's syscall() is covered, in
 * preload_syscall.c), a stdio buffer the program placed in paged memory
 * itself (setvbuf), and io_uring, whose kernel side touches
 * buffers long after the submitting call; `farmem run` pages a program
 * linked with liburing in fault=thread mode, POSIX AIO has covers of its own
 * (preload_aio.c), and docs/compatibility.md lists the rest.
 *
 * SIGBUS is the pager's: sigaction and signal for SIGBUS record the
 * program's handler, which runs for every SIGBUS that is not a paging fault
 * (monitor.c), and a thread may not block SIGBUS (a fault in a thread that
 * blocks it would kill the process).
 */
#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fm_fds.h"
#include "fm_util.h"
#include "monitor.h"
#include "pager.h"
#include "preload.h"
#include "region.h"

#define EXPORT __attribute__((visibility("default")))
#define EFAULT_TRIES 8

static void keep(struct fm_io_pins *io, int s)
{
	if (s == FM_IO_UNPINNED)
		io->unpinned = 1;
	if (s >= 0 && io->n < FM_IO_PINS)
		io->slot[io->n++] = s;
	else if (s >= 0)
		fm_pager_io_end(io->p, s);
}

/* Into the span of the rest, if it stays within FM_IO_SPAN; 0 if it would not. */
static int to_rest(struct fm_io_pins *io, const void *buf, size_t len, int write)
{
	uintptr_t b = (uintptr_t)buf, lo = io->rest_lo, hi = io->rest_hi;

	if (len > FM_IO_SPAN || b > UINTPTR_MAX - len)
		return 0;
	if (hi <= lo) {
		lo = b;
		hi = b + len;
	} else {
		lo = b < lo ? b : lo;
		hi = b + len > hi ? b + len : hi;
	}
	if (hi - lo > FM_IO_SPAN)
		return 0;
	io->rest_lo = lo;
	io->rest_hi = hi;
	io->rest_write |= write;
	return 1;
}

void fm_io_pin(struct fm_io_pins *io, const void *buf, size_t len, int write)
{
	if (!io->p || !buf || !len)
		return;
	if (io->n < FM_IO_PINS - 1 || !fm_pager_io_needed(io->p, buf, len)) {
		keep(io, fm_pager_io_begin(io->p, buf, len, write));
		return;
	}
	/*
	 * The last pin is the span's. A range that does not fit in it is made
	 * resident unpinned, and a call that meets it evicted again is made
	 * again (a datagram's would be lost).
	 */
	if (!to_rest(io, buf, len, write)) {
		int s = fm_pager_io_begin(io->p, buf, len, write);
		io->unpinned |= s == FM_IO_UNPINNED;
		fm_pager_io_end(io->p, s);
	}
}

void fm_io_pin_rest(struct fm_io_pins *io)
{
	uintptr_t lo = io->rest_lo, hi = io->rest_hi;

	if (hi <= lo)
		return;
	io->rest_lo = io->rest_hi = 0;
	keep(io, fm_pager_io_begin(io->p, (const void *)lo, hi - lo, io->rest_write));
	io->rest_write = 0;
}

/* A buffer a read from fd writes, which the device may write by DMA (O_DIRECT). */
static void pin_read(struct fm_io_pins *io, int fd, void *buf, size_t len)
{
	if (io->p && buf && len)
		keep(io, fm_pager_read_begin(io->p, buf, len, fd));
}

/* What the kernel writes, for a read from fd (-1: the call is not one). */
static void pin_one(struct fm_io_pins *io, void *buf, size_t len, int write, int read_fd)
{
	if (write && read_fd >= 0)
		pin_read(io, read_fd, buf, len);
	else
		fm_io_pin(io, buf, len, write);
}

static void pin_iov(struct fm_io_pins *io, const struct iovec *iov, int n, int write, int read_fd)
{
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	int k;

	if (!io->p || !iov || n <= 0)
		return;
	/* The kernel reads the array itself, too. */
	fm_io_pin(io, iov, (size_t)n * sizeof(*iov), 0);
	for (k = 0; k < n && io->n < FM_IO_PINS - 1; k++)
		pin_one(io, iov[k].iov_base, iov[k].iov_len, write, read_fd);
	/*
	 * More buffers than pins. Where the kernel waits, a buffer is pinned
	 * only when the device may write it by DMA (an O_DIRECT read), and a
	 * read into 256 heap blocks of 64 KiB lost what landed in those past
	 * the 16th (tests/progs/posixaio.c): such buffers go under one pin over
	 * the span they lie in, which brings nothing in. Paged ones go into the
	 * span of the rest (fm_io_pin_rest) while it stays short, and the others
	 * are made resident one by one, and a call that meets one evicted again
	 * is made again.
	 */
	for (int j = k; j < n; j++) {
		uintptr_t b = (uintptr_t)iov[j].iov_base;
		if (!iov[j].iov_len || fm_pager_io_needed(io->p, iov[j].iov_base, iov[j].iov_len)) {
			fm_io_pin(io, iov[j].iov_base, iov[j].iov_len, write);
			continue;
		}
		lo = b < lo ? b : lo;
		hi = b + iov[j].iov_len > hi ? b + iov[j].iov_len : hi;
	}
	if (write && read_fd >= 0 && hi > lo && !fm_pager_io_needed(io->p, (void *)lo, hi - lo))
		pin_read(io, read_fd, (void *)lo, hi - lo);
}

static void pin_msg(struct fm_io_pins *io, const struct msghdr *m, int write)
{
	if (!io->p || !m)
		return;
	fm_io_pin(io, m, sizeof(*m), write);
	fm_io_pin(io, m->msg_name, m->msg_namelen, write);
	fm_io_pin(io, m->msg_control, m->msg_controllen, write);
	pin_iov(io, m->msg_iov, (int)m->msg_iovlen, write, -1);
}

/* The kernel writes each message's msg_len, sending or receiving. */
static void pin_mmsg(struct fm_io_pins *io, struct mmsghdr *v, unsigned n, int write)
{
	if (!io->p || !v || !n)
		return;
	fm_io_pin(io, v, (size_t)n * sizeof(*v), 1);
	for (unsigned k = 0; k < n; k++)
		pin_msg(io, &v[k].msg_hdr, write);
}

void fm_io_unpin(struct fm_io_pins *io)
{
	for (unsigned k = 0; k < io->n; k++)
		fm_pager_io_end(io->p, io->slot[k]);
	io->n = 0;
	io->rest_lo = io->rest_hi = 0;
	io->rest_write = 0;
}

/*
 * Calls go to libc's own function after ours (fm_io_next): a cancellation
 * point where the program's was (a raw system call is not, and a thread
 * blocked in it could not be cancelled).
 */
#define LIBC(name) ((__typeof__(&name))fm_io_next(&name##_next))
FM_IO_NEXT(read_next, "read");
FM_IO_NEXT(pread_next, "pread");
FM_IO_NEXT(readv_next, "readv");
FM_IO_NEXT(preadv_next, "preadv");
FM_IO_NEXT(preadv2_next, "preadv2");
FM_IO_NEXT(write_next, "write");
FM_IO_NEXT(pwrite_next, "pwrite");
FM_IO_NEXT(writev_next, "writev");
FM_IO_NEXT(pwritev_next, "pwritev");
FM_IO_NEXT(pwritev2_next, "pwritev2");
FM_IO_NEXT(vmsplice_next, "vmsplice");
FM_IO_NEXT(recvfrom_next, "recvfrom");
FM_IO_NEXT(recvmsg_next, "recvmsg");
FM_IO_NEXT(recvmmsg_next, "recvmmsg");
FM_IO_NEXT(sendto_next, "sendto");
FM_IO_NEXT(sendmsg_next, "sendmsg");
FM_IO_NEXT(sendmmsg_next, "sendmmsg");
FM_IO_NEXT(getrandom_next, "getrandom");

extern struct fm_io_next_ref __start_fm_io_next_refs[], __stop_fm_io_next_refs[];

/* The shim's own code: a close from there is farmem's (pager.c, memd/client), not the program's. */
static uintptr_t text_lo, text_hi;

static int find_text(struct dl_phdr_info *info, size_t size, void *data)
{
	uintptr_t me = (uintptr_t)data;

	(void)size;
	for (int k = 0; k < info->dlpi_phnum; k++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[k];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;

		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && me >= lo && me < hi) {
			text_lo = lo;
			text_hi = hi;
			return 1;
		}
	}
	return 0;
}

void fm_io_bind(void)
{
	for (struct fm_io_next_ref *r = __start_fm_io_next_refs; r < __stop_fm_io_next_refs; r++)
		fm_io_next(r);
	if (!text_hi)
		dl_iterate_phdr(find_text, (void *)(uintptr_t)&fm_io_bind);
}

static int farmem_calls(const void *ret)
{
	return (uintptr_t)ret >= text_lo && (uintptr_t)ret < text_hi;
}

/* A thread cancelled in the call gives its pins back on the way out. */
void fm_io_unpin_on_cancel(void *io)
{
	fm_io_unpin(io);
}

/*
 * CALL with what SETUP pinned, made again while it fails with EFAULT on paged
 * memory (a pin the table had no room for); its result. A thread cancelled in
 * CALL gives its pins back.
 */
#define PINNED_CALL(io, setup, call)                                                    \
	({                                                                              \
		long r_;                                                                \
		int e_;                                                                 \
		for (int tries_ = 0;;) {                                                \
			setup;                                                          \
			fm_io_pin_rest(io);                                             \
			if ((io)->n) {                                                  \
				pthread_cleanup_push(fm_io_unpin_on_cancel, (io));      \
				r_ = (call);                                            \
				pthread_cleanup_pop(0);                                 \
			} else {                                                        \
				r_ = (call);                                            \
			}                                                               \
			e_ = errno;                                                     \
			fm_io_unpin(io); /* may evict: errno stays the call's */        \
			errno = e_;                                                     \
			if (r_ >= 0 || e_ != EFAULT || !(io)->p || ++tries_ >= EFAULT_TRIES) \
				break;                                                  \
			fm_pager_io_retried((io)->p);                                   \
		}                                                                       \
		r_;                                                                     \
	})

#define COVERED(setup, call)                                                            \
	do {                                                                            \
		struct fm_io_pins io_ = { .p = fm_preload_pager() };                    \
		return PINNED_CALL(&io_, setup, call);                                  \
	} while (0)

/*
 * A read, write or getrandom of more than FM_IO_PIECE on paged memory, in
 * pieces (preload.h). A 128 MiB read under a 32 MiB budget held 128 MiB
 * resident as one pin. The pieces add up to the one call: each goes on
 * while the last moved all it asked for, and an error after some bytes
 * moved returns those bytes, as a short call would. A read from anything
 * but a regular file is one piece: a pipe or socket may always return less
 * than asked, and a second piece could wait for data the call would not
 * have waited for. A write or getrandom goes on as the one call would (a
 * blocking write waits for all of it either way), except that another
 * process's O_APPEND write to the same file may land between two pieces.
 * A piece whose buffer the pin table had no room for may stop short where
 * the buffer had left again: on a regular file the rest is made again (a
 * file's read or write moves all it is asked for, but at its end or when
 * the disk is full, which the next piece meets too).
 */
static int needs_pieces(const void *buf, size_t n)
{
	struct fm_pager *p = fm_preload_pager();

	/* With the pin table nearly full, in pieces too: they go on where an unpinned buffer stopped the call. */
	return p && (n > FM_IO_PIECE || fm_pager_pins_scarce(p)) && fm_pager_io_needed(p, buf, n);
}

/*
 * A vector of buffers, in pieces too: a call whose paged buffers are more
 * than one call can pin (FM_IO_PINS, less the array's own pin and a
 * sendmsg's name and control data, and one to spare) or more than
 * FM_IO_PIECE in all. The buffers past the pins were
 * made resident one by one and left again before the call reached them: a
 * writev of 64 buffers of 1 MiB under a 16 MiB budget, or of 1024 of 64 KiB,
 * moved 16 MiB or 1 MiB of 64 and returned short, which a reader of a file
 * takes for its end (tests/progs/vecio.c), and a writer to a pipe or a
 * stream socket may not expect either. In pieces where the pieces add up to
 * the one call: a regular file or block device, and what a write goes to
 * as a stream (a pipe, past PIPE_BUF, which the kernel does not write
 * atomically either; a stream socket). A datagram stays one call, as does a
 * read from a pipe or socket (a short one it may always give).
 */
enum vec_call {
	VEC_READV, VEC_PREADV, VEC_PREADV2, VEC_WRITEV, VEC_PWRITEV, VEC_PWRITEV2, VEC_SENDMSG,
	/* One buffer (in_pieces): a piece is part[0]. */
	VEC_READ, VEC_PREAD, VEC_WRITE, VEC_PWRITE, VEC_GETRANDOM,
};
/* How the pieces go on (vec_needs_pieces's answer, or in_pieces's). */
enum { PIECES_NONE, PIECES_GO_ON, PIECES_FILE, PIECES_ONE };
#define VEC_PIECE_BUFS (FM_IO_PINS - 4)
#define VEC_PIECE_MAX 64 /* buffers a piece holds, paged or not */

/* PIECES_NONE: one call; else in pieces, PIECES_FILE on a file (a short piece may be made again). */
static int vec_needs_pieces(int fd, const struct iovec *iov, int n, int into)
{
	struct fm_pager *p;
	size_t paged = 0, all = 0;
	int bufs = 0, type;
	socklen_t tlen = sizeof(type);
	struct stat st;

	/* More than IOV_MAX: the kernel's EINVAL, not pieces that would each be allowed. */
	if (!iov || n <= 0 || n > IOV_MAX || !(p = fm_preload_pager()))
		return 0;
	for (int k = 0; k < n; k++) {
		all += iov[k].iov_len;
		if (iov[k].iov_len && fm_pager_io_needed(p, iov[k].iov_base, iov[k].iov_len)) {
			paged += iov[k].iov_len;
			bufs++;
		}
	}
	if (!bufs || (bufs <= VEC_PIECE_BUFS && paged <= FM_IO_PIECE && !fm_pager_pins_scarce(p)) || fstat(fd, &st))
		return 0;
	if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))
		return PIECES_FILE;
	if (into)
		return PIECES_NONE;
	if (S_ISFIFO(st.st_mode))
		return all > PIPE_BUF ? PIECES_GO_ON : PIECES_NONE;
	return S_ISSOCK(st.st_mode) && !getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) && type == SOCK_STREAM
		       ? PIECES_GO_ON : PIECES_NONE;
}

/* A piece; m: the sendmsg's own header, whose name goes with every piece and whose control data with the first. */
static long vec_piece(enum vec_call c, int fd, struct iovec *v, int n, off_t off, int flags, const struct msghdr *m,
		      int first)
{
	struct msghdr h;

	switch (c) {
	case VEC_READV:
		return LIBC(readv)(fd, v, n);
	case VEC_PREADV:
		return LIBC(preadv)(fd, v, n, off);
	case VEC_PREADV2:
		return LIBC(preadv2)(fd, v, n, off, flags);
	case VEC_WRITEV:
		return LIBC(writev)(fd, v, n);
	case VEC_PWRITEV:
		return LIBC(pwritev)(fd, v, n, off);
	case VEC_PWRITEV2:
		return LIBC(pwritev2)(fd, v, n, off, flags);
	case VEC_READ:
		return LIBC(read)(fd, v->iov_base, v->iov_len);
	case VEC_PREAD:
		return LIBC(pread)(fd, v->iov_base, v->iov_len, off);
	case VEC_WRITE:
		return LIBC(write)(fd, v->iov_base, v->iov_len);
	case VEC_PWRITE:
		return LIBC(pwrite)(fd, v->iov_base, v->iov_len, off);
	case VEC_GETRANDOM:
		return LIBC(getrandom)(v->iov_base, v->iov_len, (unsigned)flags);
	case VEC_SENDMSG:
		h = (struct msghdr){ .msg_name = m->msg_name, .msg_namelen = m->msg_namelen, .msg_iov = v,
				     .msg_iovlen = (size_t)n, .msg_control = first ? m->msg_control : NULL,
				     .msg_controllen = first ? m->msg_controllen : 0 };
		return LIBC(sendmsg)(fd, &h, flags);
	}
	errno = EINVAL;
	return -1;
}

/*
 * The next piece of iov from buffer *k, byte *at on, into part; how many
 * buffers it holds, and in *want their bytes. Buffers outside paged memory
 * take no pin, and are not what a piece is counted in.
 */
static int next_piece(struct fm_pager *p, const struct iovec *iov, int n, int *k, size_t *at,
		      struct iovec part[VEC_PIECE_MAX], size_t *want)
{
	size_t paged = 0;
	int np = 0, npaged = 0;

	while (*k < n && np < VEC_PIECE_MAX && npaged < VEC_PIECE_BUFS && paged < FM_IO_PIECE) {
		const struct iovec *v = &iov[*k];
		size_t left = v->iov_len - *at, take = left;
		if (left && fm_pager_io_needed(p, (char *)v->iov_base + *at, left)) {
			take = left < FM_IO_PIECE - paged ? left : FM_IO_PIECE - paged;
			paged += take;
			npaged++;
		}
		if (take)
			part[np++] = (struct iovec){ (char *)v->iov_base + *at, take };
		*want += take;
		*at += take;
		if (*at == v->iov_len) {
			(*k)++;
			*at = 0;
		}
	}
	return np;
}

/* A piece, pinned as its call would pin it: a sendmsg's name and control data besides its buffers. */
static long vec_piece_pinned(enum vec_call c, int fd, struct iovec *part, int np, off_t off, int flags,
			     const struct msghdr *m, int first, int *unpinned)
{
	struct fm_io_pins io = { .p = fm_preload_pager() };
	int into = c == VEC_READV || c == VEC_PREADV || c == VEC_PREADV2 || c == VEC_READ || c == VEC_PREAD ||
		   c == VEC_GETRANDOM;
	long r;

	r = PINNED_CALL(&io,
			   (pin_iov(&io, part, np, into, into ? fd : -1),
			    m ? (fm_io_pin(&io, m->msg_name, m->msg_namelen, 0),
				 fm_io_pin(&io, m->msg_control, first ? m->msg_controllen : 0, 0)) : (void)0),
			   vec_piece(c, fd, part, np, off, flags, m, first));
	*unpinned = io.unpinned;
	return r;
}

/*
 * The pieces add up to the one call, as in_pieces's do; an offset of -1
 * (preadv2: the file's own) stays -1. how: on a file (PIECES_FILE) a piece
 * that stopped short where a buffer the pin table had no room for had left
 * goes on from there; PIECES_ONE stops after the first piece.
 */
static ssize_t vec_in_pieces(enum vec_call c, int fd, const struct iovec *iov, int n, off_t off, int flags,
			     const struct msghdr *m, int how)
{
	struct fm_pager *p = fm_preload_pager();
	size_t at = 0, done = 0;
	int k = 0;

	while (k < n) {
		struct iovec part[VEC_PIECE_MAX];
		size_t want = 0;
		int k0 = k, np, unpinned;
		size_t at0 = at;
		long r;

		np = next_piece(p, iov, n, &k, &at, part, &want);
		if (!np)
			break;
		r = vec_piece_pinned(c, fd, part, np, off == -1 ? -1 : off + (off_t)done, flags, m, !done, &unpinned);
		if (r < 0)
			return done ? (ssize_t)done : -1;
		done += (size_t)r;
		if (how == PIECES_ONE)
			break;
		if ((size_t)r == want)
			continue;
		if (!(unpinned && how == PIECES_FILE && r > 0))
			break;
		/* From where this piece stopped. */
		for (k = k0, at = at0 + (size_t)r; k < n && at >= iov[k].iov_len; k++)
			at -= iov[k].iov_len;
	}
	return (ssize_t)done;
}

/*
 * One buffer in pieces: a read from anything but a regular file is one
 * piece (above), a write or getrandom goes on as the one call would.
 */
static ssize_t in_pieces(enum vec_call c, int fd, void *buf, size_t n, off_t off, unsigned flags)
{
	struct iovec one = { buf, n };
	struct stat st;
	int how = PIECES_GO_ON;

	if (c != VEC_GETRANDOM && !fstat(fd, &st) && S_ISREG(st.st_mode))
		how = PIECES_FILE;
	else if (c == VEC_READ || c == VEC_PREAD)
		how = PIECES_ONE;
	return vec_in_pieces(c, fd, &one, 1, off, (int)flags, NULL, how);
}

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	if (needs_pieces(buf, n))
		return in_pieces(VEC_READ, fd, buf, n, 0, 0);
	COVERED(pin_read(&io_, fd, buf, n), LIBC(read)(fd, buf, n));
}

EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	if (needs_pieces(buf, n))
		return in_pieces(VEC_PREAD, fd, buf, n, off, 0);
	COVERED(pin_read(&io_, fd, buf, n), LIBC(pread)(fd, buf, n, off));
}

EXPORT ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
	return pread(fd, buf, n, off);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	int how = vec_needs_pieces(fd, iov, n, 1);

	if (how)
		return vec_in_pieces(VEC_READV, fd, iov, n, 0, 0, NULL, how);
	COVERED(pin_iov(&io_, iov, n, 1, fd), LIBC(readv)(fd, iov, n));
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int n, off_t off)
{
	int how = vec_needs_pieces(fd, iov, n, 1);

	if (how)
		return vec_in_pieces(VEC_PREADV, fd, iov, n, off, 0, NULL, how);
	COVERED(pin_iov(&io_, iov, n, 1, fd), LIBC(preadv)(fd, iov, n, off));
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int n, off_t off)
{
	return preadv(fd, iov, n, off);
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	int how = vec_needs_pieces(fd, iov, n, 1);

	if (how)
		return vec_in_pieces(VEC_PREADV2, fd, iov, n, off, flags, NULL, how);
	COVERED(pin_iov(&io_, iov, n, 1, fd), LIBC(preadv2)(fd, iov, n, off, flags));
}

/* What a program built with _FILE_OFFSET_BITS=64 calls (stress-ng's hdd stressor did, uncovered, until session 49). */
EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	return preadv2(fd, iov, n, off, flags);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	if (needs_pieces(buf, n))
		return in_pieces(VEC_WRITE, fd, (void *)buf, n, 0, 0);
	COVERED(fm_io_pin(&io_, buf, n, 0), LIBC(write)(fd, buf, n));
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if (needs_pieces(buf, n))
		return in_pieces(VEC_PWRITE, fd, (void *)buf, n, off, 0);
	COVERED(fm_io_pin(&io_, buf, n, 0), LIBC(pwrite)(fd, buf, n, off));
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	return pwrite(fd, buf, n, off);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	int how = vec_needs_pieces(fd, iov, n, 0);

	if (how)
		return vec_in_pieces(VEC_WRITEV, fd, iov, n, 0, 0, NULL, how);
	COVERED(pin_iov(&io_, iov, n, 0, -1), LIBC(writev)(fd, iov, n));
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
	int how = vec_needs_pieces(fd, iov, n, 0);

	if (how)
		return vec_in_pieces(VEC_PWRITEV, fd, iov, n, off, 0, NULL, how);
	COVERED(pin_iov(&io_, iov, n, 0, -1), LIBC(pwritev)(fd, iov, n, off));
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int n, off_t off)
{
	return pwritev(fd, iov, n, off);
}

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	int how = vec_needs_pieces(fd, iov, n, 0);

	if (how)
		return vec_in_pieces(VEC_PWRITEV2, fd, iov, n, off, flags, NULL, how);
	COVERED(pin_iov(&io_, iov, n, 0, -1), LIBC(pwritev2)(fd, iov, n, off, flags));
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	return pwritev2(fd, iov, n, off, flags);
}

/*
 * vmsplice: a pipe's write end takes the pages themselves (references, read
 * from); its read end copies into them. Either way the kernel cannot wait
 * for a page whose fault comes by SIGBUS (EFAULT).
 */
static int pipe_read_end(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl >= 0 && (fl & O_ACCMODE) == O_RDONLY;
}

EXPORT ssize_t vmsplice(int fd, const struct iovec *iov, size_t n, unsigned int flags)
{
	COVERED(pin_iov(&io_, iov, n > INT_MAX ? INT_MAX : (int)n, io_.p && pipe_read_end(fd), -1),
		LIBC(vmsplice)(fd, iov, n, flags));
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	COVERED(fm_io_pin(&io_, buf, n, 1), LIBC(recvfrom)(fd, buf, n, flags, NULL, NULL));
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa, socklen_t *salen)
{
	COVERED((fm_io_pin(&io_, buf, n, 1), fm_io_pin(&io_, salen, sizeof(*salen), 1),
		 fm_io_pin(&io_, sa, salen ? *salen : 0, 1)),
		LIBC(recvfrom)(fd, buf, n, flags, sa, salen));
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	COVERED(pin_msg(&io_, m, 1), LIBC(recvmsg)(fd, m, flags));
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	COVERED(fm_io_pin(&io_, buf, n, 0), LIBC(sendto)(fd, buf, n, flags, NULL, 0));
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa, socklen_t salen)
{
	COVERED((fm_io_pin(&io_, buf, n, 0), fm_io_pin(&io_, sa, salen, 0)),
		LIBC(sendto)(fd, buf, n, flags, sa, salen));
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	/* Not an urgent byte (the last of the call) or zero-copy sends (a completion for each call). */
	if (m && m->msg_iovlen <= INT_MAX && !(flags & (MSG_OOB | MSG_ZEROCOPY)) &&
	    vec_needs_pieces(fd, m->msg_iov, (int)m->msg_iovlen, 0))
		return vec_in_pieces(VEC_SENDMSG, fd, m->msg_iov, (int)m->msg_iovlen, -1, flags, m, 1);
	COVERED(pin_msg(&io_, m, 0), LIBC(sendmsg)(fd, m, flags));
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *timeout)
{
	COVERED(pin_mmsg(&io_, v, n, 1), LIBC(recvmmsg)(fd, v, n, flags, timeout));
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	COVERED(pin_mmsg(&io_, v, n, 0), LIBC(sendmmsg)(fd, v, n, flags));
}

/* glibc's getentropy (256 bytes at most) makes the system call itself, past this cover. */
EXPORT ssize_t getrandom(void *buf, size_t n, unsigned flags)
{
	if (needs_pieces(buf, n))
		return in_pieces(VEC_GETRANDOM, -1, buf, n, 0, flags);
	COVERED(fm_io_pin(&io_, buf, n, 1), LIBC(getrandom)(buf, n, flags));
}

/* --- stdio ------------------------------------------------------------------------- */

/*
 * A request of MiBs is done in pieces of whole items, each pinned while
 * glibc moves it: one pin for the whole would make resident (zero-filling
 * what was never touched) all of a buffer that the file may fill only in
 * part, past the budget. The pieces add up to the same call: fread and
 * fwrite count whole items, and stop at the first short piece as they would.
 * Unlike the calls above, a piece is not made again when it still meets
 * EFAULT (the pin table full): glibc has already set the stream's error and
 * may have consumed part of an item, so the call ends short, as any failed
 * read or write of the stream would.
 */
/* glibc's stdio.h makes these macros for constant sizes; the covers are functions. */
#undef fread_unlocked
#undef fwrite_unlocked

typedef size_t (*stdio_fn)(void *, size_t, size_t, FILE *);

static size_t stdio_covered(stdio_fn next, void *ptr, size_t size, size_t n, FILE *fp, int write)
{
	struct fm_io_pins io = { .p = fm_preload_pager() };
	size_t per, done = 0;

	if (!next) {
		errno = ENOSYS;  /* no libc stdio to call: say so, not end-of-file */
		return 0;
	}
	if (!io.p || !size || !n || n > SIZE_MAX / size)
		return next(ptr, size, n, fp);
	per = size >= FM_IO_PIECE ? 1 : FM_IO_PIECE / size;
	while (done < n) {
		size_t k = n - done < per ? n - done : per, got;
		char *at = (char *)ptr + done * size;
		fm_io_pin(&io, at, k * size, write);
		got = next(at, size, k, fp);
		fm_io_unpin(&io);
		done += got;
		if (got < k)
			break;
	}
	return done;
}

EXPORT size_t fread(void *ptr, size_t size, size_t n, FILE *fp)
{
	FM_IO_NEXT(next, "fread");

	return stdio_covered((stdio_fn)fm_io_next(&next), ptr, size, n, fp, 1);
}

EXPORT size_t fread_unlocked(void *ptr, size_t size, size_t n, FILE *fp)
{
	FM_IO_NEXT(next, "fread_unlocked");

	return stdio_covered((stdio_fn)fm_io_next(&next), ptr, size, n, fp, 1);
}

EXPORT size_t fwrite(const void *ptr, size_t size, size_t n, FILE *fp)
{
	FM_IO_NEXT(next, "fwrite");

	return stdio_covered((stdio_fn)fm_io_next(&next), (void *)ptr, size, n, fp, 0);
}

EXPORT size_t fwrite_unlocked(const void *ptr, size_t size, size_t n, FILE *fp)
{
	FM_IO_NEXT(next, "fwrite_unlocked");

	return stdio_covered((stdio_fn)fm_io_next(&next), (void *)ptr, size, n, fp, 0);
}

/* --- Closing what farmem keeps open (memd/common/fm_fds.h) ----------------------------- */

FM_IO_NEXT(close_next, "close");

/*
 * A daemon closes every descriptor up to the limit; farmem's are not the
 * program's to close, so to it they are not there (EBADF). Before, the
 * pager's next step met a closed userfaultfd and stopped the program (70).
 */
EXPORT int close(int fd)
{
	if (fm_fd_owned(fd) && !farmem_calls(__builtin_return_address(0))) {
		errno = EBADF;
		return -1;
	}
	return LIBC(close)(fd);
}

FM_IO_NEXT(close_range_next, "close_range");

/* [first, last] less farmem's descriptors, one range at a time. */
static int close_ranges(unsigned first, unsigned last, int flags)
{
	int (*next)(unsigned, unsigned, int) = (int (*)(unsigned, unsigned, int))fm_io_next(&close_range_next);
	unsigned from = first;

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	for (unsigned fd = first; fd <= last && fd < FM_FDS_MAX; fd++) {
		if (!fm_fd_owned((int)fd))
			continue;
		if (fd > from && next(from, fd - 1, flags))
			return -1;
		from = fd + 1;
	}
	return from > last ? 0 : next(from, last, flags);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	if (farmem_calls(__builtin_return_address(0)) || first > last)
		return LIBC(close_range)(first, last, flags);
	return close_ranges(first, last, flags);
}

EXPORT void closefrom(int low)
{
	if (low < 0)
		low = 0;
	/* glibc's closefrom aborts when it cannot close them all; so do we. */
	if (close_ranges((unsigned)low, ~0u, 0))
		abort();
}

/*
 * A dup2 or dup3 onto a number farmem holds would close the pager's
 * descriptor under it and put the program's file in its place: the pager's
 * next write to memd would go into that file, and its pages with it. The
 * call fails with EBUSY instead (which Linux's dup2 may return), and says
 * why: the program goes on, or stops on the error it met, with its memory whole.
 */
static int dup_onto_farmem(int oldfd, int newfd, const char *how, const void *caller)
{
	static atomic_int told;

	if (oldfd == newfd || !fm_fd_owned(newfd) || farmem_calls(caller))
		return 0;
	if (!atomic_exchange(&told, 1))
		fm_warn("the program's %s onto descriptor %d, which farmem's pager holds (its memd connection, "
			"userfaultfd or residency map): refused with EBUSY", how, newfd);
	errno = EBUSY;
	return 1;
}

FM_IO_NEXT(dup2_next, "dup2");
FM_IO_NEXT(dup3_next, "dup3");

EXPORT int dup2(int oldfd, int newfd)
{
	if (dup_onto_farmem(oldfd, newfd, "dup2", __builtin_return_address(0)))
		return -1;
	return LIBC(dup2)(oldfd, newfd);
}

EXPORT int dup3(int oldfd, int newfd, int flags)
{
	if (dup_onto_farmem(oldfd, newfd, "dup3", __builtin_return_address(0)))
		return -1;
	return LIBC(dup3)(oldfd, newfd, flags);
}

/* --- _FORTIFY_SOURCE's checked forms ---------------------------------------------------- */

/*
 * A program built with _FORTIFY_SOURCE (Debian builds its packages so) calls
 * these when the compiler knows the buffer's size but not the length asked
 * for: a read of a variable length into a block malloc'd at a fixed size.
 * glibc's own go to its internal read, past the covers above, so such a read
 * into evicted memory failed with EFAULT (fread: 0 and the error set). Each
 * checks as glibc does, then goes through the cover.
 */
extern void __chk_fail(void) __attribute__((noreturn));

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		__chk_fail();
	return read(fd, buf, n);
}

EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	if (n > buflen)
		__chk_fail();
	return pread(fd, buf, n, off);
}

EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t buflen)
{
	if (n > buflen)
		__chk_fail();
	return pread(fd, buf, n, off);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	if (n > buflen)
		__chk_fail();
	return recv(fd, buf, n, flags);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *sa,
			      socklen_t *salen)
{
	if (n > buflen)
		__chk_fail();
	return recvfrom(fd, buf, n, flags, sa, salen);
}

static void fread_check(size_t ptrlen, size_t size, size_t n)
{
	size_t want;

	if (__builtin_mul_overflow(size, n, &want) || want > ptrlen)
		__chk_fail();
}

EXPORT size_t __fread_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp)
{
	fread_check(ptrlen, size, n);
	return fread(ptr, size, n, fp);
}

EXPORT size_t __fread_unlocked_chk(void *ptr, size_t ptrlen, size_t size, size_t n, FILE *fp)
{
	fread_check(ptrlen, size, n);
	return fread_unlocked(ptr, size, n, fp);
}

/* --- SIGBUS ------------------------------------------------------------------------ */

extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *old);

/*
 * The mask a call holds while it sleeps: a handler that runs then runs with
 * it. SIGBUS left out of it while the pager serves faults by SIGBUS.
 */
static const sigset_t *open_sigbus(const sigset_t *set, sigset_t *copy)
{
	if (!set || sigismember(set, SIGBUS) != 1 || !fm_monitor_sigbus_ours())
		return set;
	*copy = *set;
	sigdelset(copy, SIGBUS);
	return copy;
}

/*
 * A handler whose mask blocks SIGBUS (sigfillset(&sa.sa_mask) is common)
 * would die of the first paging fault it takes: the kernel cannot deliver a
 * fault's SIGBUS to a thread that blocks it, and kills the process.
 */
EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct sigaction open;

	if (sig == SIGBUS && fm_monitor_sigbus_action(act, old))
		return 0;
	if (act && open_sigbus(&act->sa_mask, &open.sa_mask) != &act->sa_mask) {
		sigset_t mask = open.sa_mask;

		open = *act;
		open.sa_mask = mask;
		act = &open;
	}
	return __sigaction(sig, act, old);
}

/* signal(2) with BSD semantics, as glibc's signal and bsd_signal have. */
static sighandler_t set_handler(int sig, sighandler_t h, int flags)
{
	struct sigaction sa = { .sa_handler = h, .sa_flags = flags }, old;

	sigemptyset(&sa.sa_mask);
	if (sig != SIGBUS)
		sigaddset(&sa.sa_mask, sig);
	if (sigaction(sig, &sa, &old))
		return SIG_ERR;
	return old.sa_handler;
}

EXPORT sighandler_t signal(int sig, sighandler_t h)
{
	return set_handler(sig, h, SA_RESTART);
}

EXPORT sighandler_t bsd_signal(int sig, sighandler_t h)
{
	return set_handler(sig, h, SA_RESTART);
}

EXPORT sighandler_t sysv_signal(int sig, sighandler_t h)
{
	return set_handler(sig, h, (int)(SA_RESETHAND | SA_NODEFER));
}

/*
 * What signal() is in a program built for strict ISO C (-std=c99 without
 * _GNU_SOURCE): zstd's crash handler for SIGBUS came in this way, past the
 * covers above, and took every paging fault for a crash.
 */
EXPORT sighandler_t __sysv_signal(int sig, sighandler_t h)
{
	return sysv_signal(sig, h);
}

/* SVID's ssignal is glibc's BSD signal. */
EXPORT sighandler_t ssignal(int sig, sighandler_t h)
{
	return set_handler(sig, h, SA_RESTART);
}

/*
 * SysV's sigset, sigignore and sighold, as glibc has them but through the
 * covers here: glibc's own call its internal sigaction and sigprocmask,
 * which no cover sees (a handler installed by sigset replaced the pager's).
 */
EXPORT sighandler_t sigset(int sig, sighandler_t h)
{
	struct sigaction sa = { .sa_handler = h }, old;
	sigset_t one, was;

	if (h == SIG_ERR || sig < 1 || sig >= NSIG) {
		errno = EINVAL;
		return SIG_ERR;
	}
	sigemptyset(&one);
	sigaddset(&one, sig);
	if (h == SIG_HOLD) {
		if (sigprocmask(SIG_BLOCK, &one, &was) < 0)
			return SIG_ERR;
		if (sigismember(&was, sig))
			return SIG_HOLD;
		if (sigaction(sig, NULL, &old) < 0)
			return SIG_ERR;
		return old.sa_handler;
	}
	sigemptyset(&sa.sa_mask);
	if (sigaction(sig, &sa, &old) < 0 || sigprocmask(SIG_UNBLOCK, &one, &was) < 0)
		return SIG_ERR;
	return sigismember(&was, sig) ? SIG_HOLD : old.sa_handler;
}

EXPORT int sigignore(int sig)
{
	struct sigaction sa = { .sa_handler = SIG_IGN };

	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

EXPORT int sighold(int sig)
{
	sigset_t one;

	sigemptyset(&one);
	if (sigaddset(&one, sig) < 0)
		return -1;
	return sigprocmask(SIG_BLOCK, &one, NULL);
}

/* BSD's masks are ints, bit sig - 1 for signals 1 to 31, as glibc keeps them. */
static int bsd_mask(int how, int bits)
{
	sigset_t set, was;
	int out = 0;

	sigemptyset(&set);
	for (int sig = 1; sig < 32; sig++)
		if ((unsigned)bits & (1u << (sig - 1)))
			sigaddset(&set, sig);
	if (sigprocmask(how, &set, &was) < 0)
		return -1;
	for (int sig = 1; sig < 32; sig++)
		if (sigismember(&was, sig) == 1)
			out |= (int)(1u << (sig - 1));
	return out;
}

EXPORT int sigblock(int bits)
{
	return bsd_mask(SIG_BLOCK, bits);
}

EXPORT int sigsetmask(int bits)
{
	return bsd_mask(SIG_SETMASK, bits);
}

FM_IO_NEXT(pthread_sigmask_next, "pthread_sigmask");
FM_IO_NEXT(sigprocmask_next, "sigprocmask");

static int mask(int how, const sigset_t *set, sigset_t *old, struct fm_io_next_ref *libc)
{
	int (*next)(int, const sigset_t *, sigset_t *) = (int (*)(int, const sigset_t *, sigset_t *))fm_io_next(libc);
	sigset_t s;

	if (!next)
		return ENOSYS;
	if (set && fm_preload_pager() && (how == SIG_BLOCK || how == SIG_SETMASK)) {
		s = *set;
		sigdelset(&s, SIGBUS);
		set = &s;
	}
	return next(how, set, old);
}

EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	return mask(how, set, old, &pthread_sigmask_next);
}

EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
	int rc = mask(how, set, old, &sigprocmask_next);

	/* sigprocmask says -1 and errno; pthread_sigmask returns the error. */
	if (rc == ENOSYS) {
		errno = ENOSYS;
		return -1;
	}
	return rc;
}

/* --- Stacks made of the program's memory ----------------------------------------------- */

/*
 * A stack in memory whose faults come by SIGBUS cannot take one: the kernel
 * writes the signal's frame below the stack pointer, on that stack, and a
 * page there that is not resident fails the delivery (SIGSEGV). A program's
 * coroutines on stacks it carved from malloc died so at their first fault.
 * glibc's thread stacks (MAP_STACK) are never paged; a stack the program
 * makes itself leaves paged memory when it is handed over: to makecontext,
 * pthread_create (by its attr) or sigaltstack (and a stream's buffer, below, for a
 * reason of its own). Where the kernel waits for a page (fault=thread,
 * glibc's heaps) it stays paged.
 */
static void stays_local(const void *at, size_t size, atomic_int *told, const char *what)
{
	struct fm_pager *p;
	uintptr_t a = (uintptr_t)at & ~(uintptr_t)4095, e = ((uintptr_t)at + size + 4095) & ~(uintptr_t)4095;

	if (!at || !size || e <= a || !(p = fm_preload_pager()) || !fm_region_signals(p, a, e))
		return;
	/*
	 * In pieces, each made resident the way a fault would (within the
	 * budget) and pinned until it has left the books: an evicted page of
	 * it unregistered would read back as zeros.
	 */
	for (uintptr_t x = a; x < e; x += FM_IO_PIECE) {
		size_t n = e - x < FM_IO_PIECE ? e - x : FM_IO_PIECE;
		int pin = fm_pager_io_begin(p, (void *)x, n, 0);

		if (pin < 0)
			fm_pager_fetch_all(p, (void *)x, n); /* the pin table full: hold its whole region instead */
		fm_pager_unregister(p, (void *)x, n);
		if (pin >= 0)
			fm_pager_io_end(p, pin);
	}
	if (!atomic_exchange(told, 1))
		fm_info("%s stays local (%zu KiB at %p)", what, (size_t)(e - a) >> 10, (void *)a);
}

static void stack_stays_local(const void *sp, size_t size)
{
	static atomic_int told;

	stays_local(sp, size, &told, "a stack the program made of paged memory (faults on it could not come by SIGBUS)");
}

void fm_thread_stack_stays_local(const pthread_attr_t *attr)
{
	void *low = NULL;
	size_t size = 0;

	/* glibc gives the top less the size: with no stack set, the top is NULL and the sum 0. */
	if (!attr || pthread_attr_getstack(attr, &low, &size) || !size || (uintptr_t)low + size == 0 ||
	    (uintptr_t)low + size < (uintptr_t)low)
		return;
	stack_stays_local(low, size);
}

/*
 * glibc's start_thread runs with every signal blocked until it has set the
 * thread up, and __ctype_init reads the global LC_CTYPE locale's data there:
 * a struct that setlocale allocates with the program's malloc. With glibc's
 * allocator it lies in a heap the kernel waits on; with another (mimalloc,
 * jemalloc, an executable's own) in a region whose faults come by SIGBUS,
 * and once it was evicted the next thread died at its start (python3 on
 * mimalloc, a fork-start multiprocessing.Pool under load). Its first bytes
 * (the header and the three values read) stay local; a locale set later
 * is found at the next thread's start.
 */
#define LOCALE_DATA_READ 128

void fm_thread_start_data_stays_local(void)
{
	static _Atomic(const void *) kept;
	static atomic_int told;
	locale_t global = duplocale(LC_GLOBAL_LOCALE);
	const void *ctype;

	if (!global)
		return;
	ctype = global->__locales[LC_CTYPE];
	freelocale(global);
	if (!ctype || atomic_exchange(&kept, ctype) == ctype)
		return;
	stays_local(ctype, LOCALE_DATA_READ, &told,
		    "the locale's character classes, which a thread reads at its start with every signal blocked,");
}

/* glibc takes up to any number of arguments; more than this many is not seen in programs. */
#define MAKECONTEXT_ARGS 12

FM_IO_NEXT(makecontext_next, "makecontext");

EXPORT void makecontext(ucontext_t *ucp, void (*fn)(void), int argc, ...)
{
	void (*next)(ucontext_t *, void (*)(void), int, ...) =
		(void (*)(ucontext_t *, void (*)(void), int, ...))fm_io_next(&makecontext_next);
	long v[MAKECONTEXT_ARGS] = { 0 };
	va_list ap;

	if (argc < 0 || argc > MAKECONTEXT_ARGS) {
		fm_err("makecontext with %d arguments: farmem passes on at most %d; stopping rather than run the "
			 "coroutine with the wrong ones", argc, MAKECONTEXT_ARGS);
		abort();
	}
	stack_stays_local(ucp->uc_stack.ss_sp, ucp->uc_stack.ss_size);
	va_start(ap, argc);
	for (int k = 0; k < argc; k++)
		v[k] = va_arg(ap, long); /* glibc reads them as greg_t, a long here */
	va_end(ap);
	next(ucp, fn, argc, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]);
}

FM_IO_NEXT(sigaltstack_next, "sigaltstack");

EXPORT int sigaltstack(const stack_t *ss, stack_t *old)
{
	int (*next)(const stack_t *, stack_t *) = (int (*)(const stack_t *, stack_t *))fm_io_next(&sigaltstack_next);

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (ss && !(ss->ss_flags & SS_DISABLE))
		stack_stays_local(ss->ss_sp, ss->ss_size);
	if (next(ss, old))
		return -1;
	if (ss && (ss->ss_flags & SS_DISABLE))
		fm_monitor_altstack_released();
	return 0;
}

/* --- Starting a program: its path, arguments and environment ---------------------------- */

/*
 * execve and posix_spawn hand the kernel the path, and every string of argv
 * and envp, which it copies before the new program replaces the old: a
 * string on an evicted page of a region whose faults come by SIGBUS failed
 * the call with EFAULT (a program's argument table in a big block; any of
 * them in the blocks of an allocator other than glibc's). No pin fits a
 * vector of thousands of strings: each is read through once, which brings
 * its pages home, and a call that still meets EFAULT (a page taken again by
 * an eviction in between) is made again. A failed exec or spawn changed
 * nothing, so the next try is the same call.
 */
#define EXEC_TRIES 4

static int exec_paged(void)
{
	return fm_monitor_sigbus_ours() && fm_preload_pager();
}

static void touch_string(const char *str)
{
	size_t n;

	if (!str)
		return;
	n = strlen(str);
	__asm__ volatile("" : : "r"(n) : "memory"); /* read, not optimised away */
}

static void touch_vector(char *const *v)
{
	if (!v)
		return;
	for (size_t i = 0;; i++) {
		const char *str = ((char *const volatile *)v)[i];

		if (!str)
			break;
		touch_string(str);
	}
}

static void exec_touch(const char *path, char *const argv[], char *const envp[])
{
	touch_string(path);
	touch_vector(argv);
	touch_vector(envp);
}

/* Whether the call that just failed with EFAULT goes again (counted), its strings read in again. */
static int exec_again(int *tries, int err, const char *path, char *const argv[], char *const envp[])
{
	struct fm_pager *p;

	if (err != EFAULT || ++*tries >= EXEC_TRIES || !(p = fm_preload_pager()))
		return 0;
	fm_pager_io_retried(p);
	exec_touch(path, argv, envp);
	return 1;
}

FM_IO_NEXT(execve_next, "execve");
FM_IO_NEXT(execvpe_next, "execvpe");
FM_IO_NEXT(execveat_next, "execveat");
FM_IO_NEXT(fexecve_next, "fexecve");
FM_IO_NEXT(posix_spawn_next, "posix_spawn");
FM_IO_NEXT(posix_spawnp_next, "posix_spawnp");
FM_IO_NEXT(system_next, "system");
FM_IO_NEXT(popen_next, "popen");

typedef int (*exec_fn)(const char *, char *const[], char *const[]);

/* execve and execvpe (the same arguments): the strings read in, the call made again after EFAULT. */
static int exec_cover(struct fm_io_next_ref *ref, const char *path, char *const argv[], char *const envp[])
{
	exec_fn next = (exec_fn)fm_io_next(ref);
	int tries = 0, paged = exec_paged();

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (paged)
		exec_touch(path, argv, envp);
	while (next(path, argv, envp) && paged && exec_again(&tries, errno, path, argv, envp))
		;
	return -1;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	return exec_cover(&execve_next, path, argv, envp);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	return exec_cover(&execvpe_next, file, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
	int (*next)(int, const char *, char *const[], char *const[], int) =
		(int (*)(int, const char *, char *const[], char *const[], int))fm_io_next(&execveat_next);
	int tries = 0, paged = exec_paged();

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (paged)
		exec_touch(path, argv, envp);
	while (next(dirfd, path, argv, envp, flags) && paged && exec_again(&tries, errno, path, argv, envp))
		;
	return -1;
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	int (*next)(int, char *const[], char *const[]) =
		(int (*)(int, char *const[], char *const[]))fm_io_next(&fexecve_next);
	int tries = 0, paged = exec_paged();

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (paged)
		exec_touch(NULL, argv, envp);
	while (next(fd, argv, envp) && paged && exec_again(&tries, errno, NULL, argv, envp))
		;
	return -1;
}

/*
 * execl, execlp and execle: glibc builds the vector and calls its own execve
 * or execvpe, past the covers; so does this, through the covers. The vector
 * lives on this stack, as glibc's does; execle's envp follows the NULL.
 */
static int exec_list(struct fm_io_next_ref *ref, const char *path, const char *arg, va_list ap, int with_env)
{
	size_t n = 1;
	va_list count;

	va_copy(count, ap);
	while (va_arg(count, char *))
		n++;
	va_end(count);
	char *argv[n + 1];

	argv[0] = (char *)arg;
	for (size_t k = 1; k <= n; k++)
		argv[k] = va_arg(ap, char *);
	return exec_cover(ref, path, argv, with_env ? va_arg(ap, char *const *) : environ);
}

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(&execve_next, path, arg, ap, 0);
	va_end(ap);
	return rc;
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(&execvpe_next, file, arg, ap, 0);
	va_end(ap);
	return rc;
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(&execve_next, path, arg, ap, 1);
	va_end(ap);
	return rc;
}

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
			char *const[], char *const[]);

/* posix_spawn and posix_spawnp: a spawn that failed ran nothing in this process, and goes again. */
static int spawn_cover(struct fm_io_next_ref *ref, pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	spawn_fn next = (spawn_fn)fm_io_next(ref);
	int rc, tries = 0, paged = exec_paged();

	if (!next)
		return ENOSYS;
	if (paged)
		exec_touch(path, argv, envp);
	while ((rc = next(pid, path, fa, attr, argv, envp)) && paged && exec_again(&tries, rc, path, argv, envp))
		;
	return rc;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn_cover(&posix_spawn_next, pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	return spawn_cover(&posix_spawnp_next, pid, file, fa, attr, argv, envp);
}

/*
 * system and popen: glibc spawns sh -c COMMAND with its own posix_spawn. A
 * spawn that failed leaves its error in errno, and system says 127 as if the
 * shell had exited so; errno is cleared first, so that a shell that ran and
 * exited 127 is never run again.
 */
EXPORT int system(const char *command)
{
	int (*next)(const char *) = (int (*)(const char *))fm_io_next(&system_next);
	int rc, tries = 0, paged = exec_paged();

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (paged)
		exec_touch(command, environ, NULL);
	for (;;) {
		errno = 0;
		rc = next(command);
		if (rc != (127 << 8) || !paged || !exec_again(&tries, errno, command, environ, NULL))
			return rc;
	}
}

EXPORT FILE *popen(const char *command, const char *mode)
{
	FILE *(*next)(const char *, const char *) = (FILE * (*)(const char *, const char *)) fm_io_next(&popen_next);
	FILE *fp;
	int tries = 0, paged = exec_paged();

	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	if (paged)
		exec_touch(command, environ, NULL);
	/* glibc's popen says ENOMEM for a spawn that failed, EFAULT included; a failed popen ran nothing. */
	while (!(fp = next(command, mode)) && paged &&
	       exec_again(&tries, errno == ENOMEM ? EFAULT : errno, command, environ, NULL))
		;
	return fp;
}

/* --- A stream's buffer of the program's memory ------------------------------------------ */

/*
 * setvbuf and setbuffer make the program's memory a stream's buffer, which
 * glibc fills and drains with its own read and write, past the covers: in
 * memory whose faults come by SIGBUS, an evicted page of it failed them with
 * EFAULT (the stream's written lines lost, its reads at an error). Such a
 * buffer leaves paged memory when it is handed over, as a stack does.
 */
static void stream_buffer_stays_local(const char *b, size_t size)
{
	static atomic_int told;

	stays_local(b, size, &told, "a stream's buffer the program made of paged memory (setvbuf; glibc reads and "
		    "writes it past the covers)");
}

FM_IO_NEXT(setvbuf_next, "setvbuf");
FM_IO_NEXT(setbuffer_next, "setbuffer");

EXPORT int setvbuf(FILE *fp, char *b, int mode, size_t size)
{
	int (*next)(FILE *, char *, int, size_t) = (int (*)(FILE *, char *, int, size_t))fm_io_next(&setvbuf_next);

	if (!next) {
		errno = ENOSYS;
		return EOF;
	}
	if (b && mode != _IONBF)
		stream_buffer_stays_local(b, size);
	return next(fp, b, mode, size);
}

EXPORT void setbuffer(FILE *fp, char *b, size_t size)
{
	void (*next)(FILE *, char *, size_t) = (void (*)(FILE *, char *, size_t))fm_io_next(&setbuffer_next);

	stream_buffer_stays_local(b, size);
	if (next)
		next(fp, b, size);
}

EXPORT void setbuf(FILE *fp, char *b)
{
	/* glibc's setbuf is setbuffer(fp, b, BUFSIZ), within libc: past this cover's setbuffer. */
	setbuffer(fp, b, BUFSIZ);
}

FM_IO_NEXT(sigsuspend_next, "sigsuspend");

EXPORT int sigsuspend(const sigset_t *set)
{
	int (*next)(const sigset_t *) = (int (*)(const sigset_t *))fm_io_next(&sigsuspend_next);
	sigset_t s;

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	return next(open_sigbus(set, &s));
}

/*
 * The waits for descriptors: the kernel reads the program's arrays and
 * writes its answers into them, and with faults served in the faulting
 * thread it cannot wait for a page of them (EFAULT). Erlang keeps its poll
 * set's events in its own allocator's blocks, paged: erts_poll_wait failed
 * with efault and the runtime hung (session 34). The arrays are pinned for
 * the call, as a read's buffer is; a wait may last, and its pages stay
 * resident while it does, as a sleeping lock's do (preload_sync.c). The
 * sleeping ones also open SIGBUS in their masks.
 */
FM_IO_NEXT(poll_next, "poll");
FM_IO_NEXT(ppoll_next, "ppoll");
FM_IO_NEXT(select_next, "select");
FM_IO_NEXT(pselect_next, "pselect");
FM_IO_NEXT(epoll_wait_next, "epoll_wait");
FM_IO_NEXT(epoll_pwait_next, "epoll_pwait");
FM_IO_NEXT(epoll_pwait2_next, "epoll_pwait2");

static void pin_fdsets(struct fm_io_pins *io, int n, fd_set *r, fd_set *w, fd_set *e)
{
	size_t len = n > 0 ? ((size_t)n + 7) / 8 : 0;

	fm_io_pin(io, r, len, 1);
	fm_io_pin(io, w, len, 1);
	fm_io_pin(io, e, len, 1);
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int tmo)
{
	COVERED(fm_io_pin(&io_, fds, n * sizeof(*fds), 1), LIBC(poll)(fds, n, tmo));
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int tmo, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		__chk_fail();
	return poll(fds, n, tmo);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *set)
{
	sigset_t s;
	const sigset_t *m = open_sigbus(set, &s);

	COVERED((fm_io_pin(&io_, fds, n * sizeof(*fds), 1), fm_io_pin(&io_, tmo, sizeof(*tmo), 0),
		 fm_io_pin(&io_, m, sizeof(*m), 0)),
		LIBC(ppoll)(fds, n, tmo, m));
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *set, size_t fdslen)
{
	if (fdslen / sizeof(*fds) < n)
		__chk_fail();
	return ppoll(fds, n, tmo, set);
}

EXPORT int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tmo)
{
	COVERED((pin_fdsets(&io_, n, r, w, e), fm_io_pin(&io_, tmo, sizeof(*tmo), 1)), LIBC(select)(n, r, w, e, tmo));
}

EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *tmo, const sigset_t *set)
{
	sigset_t s;
	const sigset_t *m = open_sigbus(set, &s);

	COVERED((pin_fdsets(&io_, n, r, w, e), fm_io_pin(&io_, tmo, sizeof(*tmo), 0), fm_io_pin(&io_, m, sizeof(*m), 0)),
		LIBC(pselect)(n, r, w, e, tmo, m));
}

EXPORT int epoll_wait(int fd, struct epoll_event *ev, int max, int tmo)
{
	COVERED(fm_io_pin(&io_, ev, max > 0 ? (size_t)max * sizeof(*ev) : 0, 1), LIBC(epoll_wait)(fd, ev, max, tmo));
}

EXPORT int epoll_pwait(int fd, struct epoll_event *ev, int max, int tmo, const sigset_t *set)
{
	sigset_t s;
	const sigset_t *m = open_sigbus(set, &s);

	COVERED((fm_io_pin(&io_, ev, max > 0 ? (size_t)max * sizeof(*ev) : 0, 1), fm_io_pin(&io_, m, sizeof(*m), 0)),
		LIBC(epoll_pwait)(fd, ev, max, tmo, m));
}

EXPORT int epoll_pwait2(int fd, struct epoll_event *ev, int max, const struct timespec *tmo, const sigset_t *set)
{
	sigset_t s;
	const sigset_t *m = open_sigbus(set, &s);

	COVERED((fm_io_pin(&io_, ev, max > 0 ? (size_t)max * sizeof(*ev) : 0, 1), fm_io_pin(&io_, tmo, sizeof(*tmo), 0),
		 fm_io_pin(&io_, m, sizeof(*m), 0)),
		LIBC(epoll_pwait2)(fd, ev, max, tmo, m));
}
