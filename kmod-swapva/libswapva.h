/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libswapva - batched page move and swap in the caller's own address space.
 *
 * Backends, best first, picked at swapva_open() and reported:
 *   kmod     /dev/swapva (kmod-swapva): PTE swaps, one TLB shootdown a batch
 *   uffd     UFFDIO_MOVE (Linux 6.8+): SWAP is three moves through a scratch
 *            area (A->tmp, B->A, tmp->B); MOVE is one move into an empty
 *            dst, and from the first populated dst page on a SWAP
 *   memmove  always correct, copies bytes
 * A segment a backend refuses with EBUSY/EOPNOTSUPP/EAGAIN (or ENOENT, EEXIST
 * for uffd) falls to the next backend; other errors are final. Every segment
 * is all-or-nothing. Semantics of SWAP and MOVE are those of swapva.h.
 *
 * The uffd backend registers the ranges it is asked to use (exactly those,
 * or what swapva_register() was given) with its own userfaultfd (MISSING
 * mode) and keeps them registered until the last context closes; a thread
 * of the library answers faults on holes in them with zero pages, so the
 * memory behaves as plain anonymous memory. swapva_release() unregisters a range
 * (call it before munmap-ing and reusing the address range for something the
 * caller registers with another userfaultfd). A caller that already owns a
 * userfaultfd on the ranges (the farmem pager) passes it with
 * swapva_use_uffd(); then the library neither registers nor handles faults.
 *
 * Thread safety: one swapva_ctx per thread, or serialize calls on a ctx.
 */
#ifndef LIBSWAPVA_H
#define LIBSWAPVA_H

#include <stddef.h>
#include <stdint.h>

#include "swapva.h"

#ifdef __cplusplus
extern "C" {
#endif

enum swapva_backend {
	SWAPVA_BACKEND_AUTO    = 0,
	SWAPVA_BACKEND_KMOD    = 1,
	SWAPVA_BACKEND_UFFD    = 2,
	SWAPVA_BACKEND_MEMMOVE = 3,
};
#define SWAPVA_NBACKENDS 4

struct swapva_ctx;

struct swapva_result {
	uint32_t done;                    /* segments completed, in order */
	int      err;                     /* 0, or positive errno of segment [done] */
	uint64_t segs_by[SWAPVA_NBACKENDS]; /* segments completed per backend */
	uint64_t bytes_by[SWAPVA_NBACKENDS];
};

/*
 * Open a context. want = SWAPVA_BACKEND_AUTO picks the best available; any
 * other value forces that backend as the first rung (the ladder below it
 * still applies) and fails with ENODEV if it is unavailable. The environment
 * variable SWAPVA_BACKEND=kmod|uffd|memmove overrides AUTO.
 * Returns 0 or a positive errno.
 */
int swapva_open(struct swapva_ctx **out, enum swapva_backend want);
void swapva_close(struct swapva_ctx *ctx);

/* The first rung in use, and a human-readable "kmod>uffd>memmove" ladder. */
enum swapva_backend swapva_backend(const struct swapva_ctx *ctx);
const char *swapva_describe(const struct swapva_ctx *ctx);
const char *swapva_backend_name(enum swapva_backend b);
/* Which backends this machine offers (bit 1 << SWAPVA_BACKEND_x). */
unsigned swapva_available(void);
/* Suggested smallest segment, in pages, worth moving instead of copying. */
unsigned swapva_breakeven_pages(const struct swapva_ctx *ctx);

/* Disable the fallthrough: a refused segment fails instead (for tests). */
void swapva_set_strict(struct swapva_ctx *ctx, int strict);
/* uffd backend: use the caller's userfaultfd (must have UFFD_FEATURE_MOVE
 * and MISSING registration on every range used). -1 = own one again. */
int swapva_use_uffd(struct swapva_ctx *ctx, int uffd);
/* uffd backend: register a whole region (a heap) once, so that calls on
 * ranges inside it skip the per-range registration. Optional. */
int swapva_register(struct swapva_ctx *ctx, void *addr, size_t len);
/* uffd backend: stop tracking and unregister [addr, addr+len). */
int swapva_release(struct swapva_ctx *ctx, void *addr, size_t len);

/*
 * Run nr segments with op SWAPVA_OP_SWAP or SWAPVA_OP_MOVE. Returns 0 when
 * all completed, else the positive errno of the first failed segment; res
 * (may be NULL) says how many completed and by which backend. Arguments are
 * validated for the whole batch first: a batch with an invalid segment k
 * still runs segments [0, k) and then fails with EINVAL at k.
 */
int swapva_batch(struct swapva_ctx *ctx, unsigned op, const struct swapva_seg *segs,
		 unsigned nr, struct swapva_result *res);
int swapva_move(struct swapva_ctx *ctx, void *dst, void *src, size_t len);
int swapva_swap(struct swapva_ctx *ctx, void *a, void *b, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* LIBSWAPVA_H */
