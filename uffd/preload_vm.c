// SPDX-License-Identifier: Apache-2.0
/*
 * The shim's covers of process_vm_readv and process_vm_writev.
 *
 * Where faults raise SIGBUS, the call fails with EFAULT on a page that has
 * left, on either side: this process's buffers, which a pin here keeps
 * resident, and the other process's, which only that process's pager can
 * bring back (its lender, lend.h). So a read is made as it is first, and
 * costs nothing more when it moves everything; one that fails with EFAULT,
 * or stops short, goes on from where it stopped in pieces of FM_IO_PIECE,
 * each with this side's buffers pinned and the other side's lent. A write
 * into a process that lends is lent from the start (vm_rw). A call that
 * meets an address mapped nowhere still fails, as it would have, after the
 * bytes before it moved.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#include "lend.h"
#include "pager.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

FM_IO_NEXT(process_vm_readv_next, "process_vm_readv");
FM_IO_NEXT(process_vm_writev_next, "process_vm_writev");

typedef ssize_t (*vm_rw_fn)(pid_t, const struct iovec *, unsigned long, const struct iovec *, unsigned long,
			    unsigned long);

static size_t total(const struct iovec *v, unsigned long n)
{
	size_t t = 0;

	for (unsigned long k = 0; k < n; k++)
		t = v[k].iov_len > SIZE_MAX - t ? SIZE_MAX : t + v[k].iov_len;
	return t;
}

/*
 * The bytes [at, at + *len) of v as at most max iovecs in out; *len shrinks
 * to what max of them hold. Their number.
 */
static unsigned cut(const struct iovec *v, unsigned long n, size_t at, size_t *len, struct iovec *out, unsigned max)
{
	size_t want = *len, got = 0;
	unsigned m = 0;

	for (unsigned long k = 0; k < n && got < want && m < max; k++) {
		size_t l = v[k].iov_len;
		if (at >= l) {
			at -= l;
			continue;
		}
		l -= at;
		if (l > want - got)
			l = want - got;
		out[m++] = (struct iovec){ (char *)v[k].iov_base + at, l };
		got += l;
		at = 0;
	}
	*len = got;
	return m;
}

static int local_paged(struct fm_pager *p, const struct iovec *v, unsigned long n)
{
	for (unsigned long k = 0; p && k < n; k++)
		if (v[k].iov_len && fm_pager_io_needed(p, v[k].iov_base, v[k].iov_len))
			return 1;
	return 0;
}

static ssize_t vm_rw(vm_rw_fn call, int writes_remote, pid_t pid, const struct iovec *lv, unsigned long ln,
		     const struct iovec *rv, unsigned long rn, unsigned long flags)
{
	struct fm_pager *p = fm_preload_pager();
	size_t want = total(lv, ln) < total(rv, rn) ? total(lv, ln) : total(rv, rn), done;
	/*
	 * A write into a process whose pager lends is always lent: where the
	 * kernel waits for its pages (its heaps) the call would not fail, but
	 * the kernel writes a page through a pin of its own, past the page
	 * table, and eviction there could drop the page under the write.
	 */
	int lender = writes_remote && want && !flags && ln <= IOV_MAX && rn <= IOV_MAX ? fm_lend_connect(pid) : -1;
	ssize_t r = 0;
	int e = 0;

	if (lender < 0) {
		r = call(pid, lv, ln, rv, rn, flags);
		e = errno;
		if ((r < 0 && e != EFAULT) || (r >= 0 && (size_t)r >= want))
			return r;
		lender = writes_remote ? -1 : fm_lend_connect(pid);
		if (lender < 0 && !local_paged(p, lv, ln)) {
			errno = e;
			return r;
		}
	}
	done = r > 0 ? (size_t)r : 0;
	while (done < want) {
		struct iovec lp[FM_IO_PINS - 1], rp[FM_LEND_RANGES];
		struct fm_io_pins io = { .p = p };
		size_t len = want - done < FM_IO_PIECE ? want - done : FM_IO_PIECE;
		unsigned nl, nr;
		ssize_t q;

		cut(lv, ln, done, &len, lp, FM_IO_PINS - 1);
		nr = cut(rv, rn, done, &len, rp, FM_LEND_RANGES);
		nl = cut(lv, ln, done, &len, lp, FM_IO_PINS - 1);
		/* FM_IO_PINS - 1 of them: each takes a pin of its own, none a span (preload.h). */
		for (unsigned k = 0; k < nl; k++)
			fm_io_pin(&io, lp[k].iov_base, lp[k].iov_len, !writes_remote);
		if (lender >= 0 && fm_lend_ask(lender, rp, nr, writes_remote)) {
			close(lender);
			lender = -1;
		}
		q = call(pid, lp, nl, rp, nr, flags);
		e = errno;
		fm_io_unpin(&io);
		if (q <= 0) {
			if (!done)
				r = -1;
			break;
		}
		done += (size_t)q;
		if ((size_t)q < len)
			break;
	}
	if (lender >= 0)
		close(lender);
	errno = e;
	return r < 0 && !done ? -1 : (ssize_t)done;
}

EXPORT ssize_t process_vm_readv(pid_t pid, const struct iovec *lv, unsigned long ln, const struct iovec *rv,
				unsigned long rn, unsigned long flags)
{
	return vm_rw((vm_rw_fn)fm_io_next(&process_vm_readv_next), 0, pid, lv, ln, rv, rn, flags);
}

EXPORT ssize_t process_vm_writev(pid_t pid, const struct iovec *lv, unsigned long ln, const struct iovec *rv,
				 unsigned long rn, unsigned long flags)
{
	return vm_rw((vm_rw_fn)fm_io_next(&process_vm_writev_next), 1, pid, lv, ln, rv, rn, flags);
}
