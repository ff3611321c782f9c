/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pager's side of memd: one interface over every transport
 * (memd/client/, one file each, behind one table of operations):
 *
 *  - stream: the two-sided request/response protocol over TCP or a Unix
 *    socket (docs/protocol.md); every read and write is a round trip.
 *  - shm:    one-sided access to a same-host memd's store, a memfd passed over
 *    the Unix socket after authentication; the socket carries only space
 *    management and quota.
 *  - rdma:   one-sided verbs into registered spaces; space management, quota
 *    and COPY go over a TCP control connection.
 *  - several memds ("A,B,C"): one stream transport per server behind this
 *    same interface, pages placed by rendezvous hashing and written to
 *    cfg.replicas of them.
 *
 * The fault path calls fm_chan_read/fm_chan_write and never learns which
 * one it has. A channel belongs to one thread at a time; the transport itself
 * (space management) is thread-safe.
 *
 * Deadlines. Every call returns within the transport's timeout
 * (cfg.timeout_ms), however memd behaves (silent, trickling, stopped with its
 * connections open): -ETIMEDOUT then. With several memds a page's read or
 * write that times out goes to the next replica, so a call takes at most the
 * timeout for each replica it tries; a server that keeps timing out is given
 * up on. With one copy left nowhere else, the call fails.
 *
 * Signal safety. fm_chan_read, fm_chan_write, fm_chan_copy and
 * fm_chan_discard may run in a signal handler (the faulting thread's
 * SIGBUS), one channel per thread at a time. On every path, failures
 * included, they
 *  - allocate nothing and call no stdio: messages are formatted by
 *    fm_vfmt and written with one write(2) (fm_log);
 *  - take no lock that their own thread could hold already: the few locks
 *    they may take (a control connection's, to refill the quota grant or to
 *    send rdma's COPY; the space table of several memds, when a server is
 *    lost) are held elsewhere only over the transport's own memory, never
 *    while paged memory is touched, so a SIGBUS never interrupts their
 *    holder;
 *  - keep their scratch in the channel, not on the stack (a few KiB of
 *    stack per call);
 *  - make a connection again (several memds, after a failure) without the
 *    resolver or an allocation: addresses are resolved at fm_xport_connect,
 *    and the handshake's HMAC runs on the stack.
 * Per-call cost is what the transport needs: an shm read is a pointer into
 * the shared store and a checksum check, no system call.
 * fm_xport_* and fm_chan_open/close are not signal-safe.
 */
#ifndef FARMEM_TRANSPORT_H
#define FARMEM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "protocol.h"

struct fm_xport;
struct fm_chan;

enum fm_xport_pref { FM_PREF_AUTO = 0, FM_PREF_STREAM = 1, FM_PREF_SHM = 2 };

/* What a transport is; the residency map's header records it (uffd/resmap.h, cli resmap.py). */
enum fm_xport_kind { FM_XPORT_NONE = 0, FM_XPORT_STREAM = 1, FM_XPORT_SHM = 2, FM_XPORT_RDMA = 3 };

struct fm_xport_cfg {
	const char *addr;      /* "unix:/path", "tcp:HOST:PORT", "HOST:PORT", "rdma://ADDR:PORT", or "A,B,..." */
	const void *secret;    /* shared secret (the token's bytes) */
	size_t secret_len;
	int pref;              /* enum fm_xport_pref */
	int timeout_ms;        /* every call's deadline; 0 = 10 s (1 s with several memds) */
	int replicas;          /* several memds: copies of every page; 0 = 1 */
	unsigned spin_us;      /* poll for a reply (stream, conn.h) or completion (rdma) this long before sleeping; 0 never */
};

/*
 * What several memds count (zero with one memd). The same six words, in
 * this order, as the memd_* block of the pager's statistics (uffd/resmap.h),
 * so that the pager can hand that block to fm_xport_set_counters.
 */
struct fm_xport_counters {
	uint64_t failovers;       /* page reads/writes that went to another replica after a failure */
	uint64_t timeouts;        /* requests to a memd that did not answer within the timeout */
	uint64_t servers_lost;    /* memd servers given up on (connection lost, or silent too long) */
	uint64_t servers_live;    /* gauge: memd servers in use */
	uint64_t rereplicated;    /* pages copied to another memd to restore R replicas */
	uint64_t degraded_writes; /* pages acknowledged by fewer than R replicas */
};

/*
 * Connect, authenticate, create a session. On failure returns -errno and
 * writes a sentence for the user into err.
 */
int fm_xport_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out,
		     char *err, size_t errlen);
void fm_xport_close(struct fm_xport *x);
int fm_xport_kind(const struct fm_xport *x);  /* enum fm_xport_kind */
const char *fm_xport_addr(const struct fm_xport *x);

/*
 * From now on count into *c (updated with atomic adds, so readers in other
 * processes see them move), starting from what was counted so far.
 */
void fm_xport_set_counters(struct fm_xport *x, struct fm_xport_counters *c);

/*
 * Spaces one transport has open at once: one per paged range of the pager
 * (as many as the residency map's region slots, uffd/resmap.h), and memd
 * allows a session more (MEMD_MAX_SPACES_PER_SESSION). More: -ENOSPC.
 */
#define FM_XPORT_MAX_SPACES 512u

int fm_xport_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id);
int fm_xport_space_close(struct fm_xport *x, uint32_t space_id);
int fm_xport_stats(struct fm_xport *x, struct fm_stats *st);

/*
 * Pages of memory that memd's store keeps for the caller without holding a
 * page in them: slots fm_chan_forget kept and nothing has written again
 * since, not yet given back by fm_chan_release or a discard. Exact, and
 * cheap (a sum of counters). 0 where forget keeps nothing.
 */
uint64_t fm_xport_kept_pages(struct fm_xport *x);

/*
 * The program's threads are stopped (begin=1) or run again (begin=0): a
 * collector's pause, when nothing but the caller's pause workers touches
 * the pages. Within it a store page whose checksum was checked, or
 * computed by a write, is not checked again until the pause ends: a full
 * GC reads the same cold page's header in each of its four phases, and in
 * shm a read hashes the whole page for the 24 bytes it wants. Each pause
 * starts with every page unchecked, so a stray write into the store is
 * still found, at the latest at the next pause's first read of the page.
 * Pauses may nest (counted). Only shm has such a window: in the other
 * transports each read brings the page's bytes here and checks them as
 * they arrive.
 */
void fm_xport_pause(struct fm_xport *x, int begin);

/* A channel for the calling thread. */
int fm_chan_open(struct fm_xport *x, struct fm_chan **out);
void fm_chan_close(struct fm_chan *c);

/*
 * Read n (<= FM_MAX_BATCH) pages. On success src[i] points at page i's
 * bytes, checksum verified, valid until the next call on this channel.
 * Returns 0, -EIO (checksum), -ENOENT (memd has no such page), -ETIMEDOUT,
 * -EHOSTDOWN (every server that held it is lost) or -errno.
 */
int fm_chan_read(struct fm_chan *c, uint32_t space, const uint64_t *pages,
		 unsigned n, const void **src);

/*
 * Write n (<= FM_MAX_BATCH) pages and return only when memd holds their
 * bytes. status[i] is FM_OK or FM_E_FULL (memd refused it: keep it local).
 * Returns 0 when every status is valid, or -errno when none is. In shm,
 * data[i] may be the page's own slot (fm_chan_page_open with
 * FM_PAGE_OVERWRITE, caller holding the page): its bytes are then checksummed
 * and published where they are, with no copy.
 */
int fm_chan_write(struct fm_chan *c, uint32_t space, const uint64_t *pages,
		  unsigned n, const void *const *data, uint32_t *status);

/*
 * Copy n (<= FM_MAX_BATCH) pages inside memd, in order: page spages[i] of
 * space src to page dpages[i] of space dst, stored bytes and checksum,
 * without bringing them here. stream and rdma: one COPY request (rdma on the
 * control connection); shm: slot to slot in the shared store; several
 * memds: COPY to every live server holding the source. status[i] is FM_OK
 * (memd holds the source's bytes at the destination) or, with the
 * destination unchanged, FM_E_ABSENT (no such source page), FM_E_FULL (no
 * room), FM_E_RANGE or FM_E_INTERNAL (no server holding the source copied
 * it): the caller moves those pages another way. Returns 0 when every
 * status is valid, -EOPNOTSUPP when memd cannot copy (one that predates
 * COPY: read and write instead), or -errno when none is.
 */
int fm_chan_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status);

/* Tell memd that these pages are dead: their next read is FM_E_ABSENT. */
int fm_chan_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r,
		    unsigned n);

/*
 * The same, but the memory that held them stays where memd keeps pages, for
 * pages about to be written again (a collector's free space): shm, whose
 * store is a memfd a fresh page would fault into (a page allocated and
 * zeroed for each write after a discard: GcChurn spent 5% of its CPU
 * there). *kept says whether it stayed; with other transports memd frees
 * it at once, as a discard. The caller gives it back with fm_chan_release,
 * holding the pages (no write to those slots may race the release); a slot
 * memd holds a copy in again keeps its memory.
 */
int fm_chan_forget(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n, int *kept);
int fm_chan_release(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n);

/*
 * EDIT (protocol.h): byte-granular changes to pages memd holds, done there,
 * entries e[0..n) in order, all or nothing (n <= FM_MAX_EDITS, at most
 * FM_MAX_EDIT_PAGES pages): a collector's object moves over the wire without
 * the pages. put: the PUT entries' bytes, concatenated (put_len); on success
 * *get points at the GET entries' bytes, concatenated (get_len, at most
 * FM_MAX_BATCH pages), valid until the channel's next call. 0, -EOPNOTSUPP
 * (memd predates EDIT, or the transport cannot ask: rdma, several memds),
 * -ENOSPC (memd full: nothing changed), -EIO (a page's checksum), -ENOENT (a
 * page read that memd does not hold), or -errno.
 */
int fm_chan_edit(struct fm_chan *c, uint32_t space, const struct fm_edit_ent *e, unsigned n,
		 const void *put, size_t put_len, size_t get_len, const void **get);

/*
 * A page's bytes where memd keeps them, to change them there (a collector's
 * object moves done inside memd, uffd/compact.c): shm only, whose store is
 * mapped here; -EOPNOTSUPP elsewhere. *bytes points at the page in the store
 * until fm_chan_page_seal. A page memd holds is checked first (-EIO:
 * checksum); with FM_PAGE_CREATE, a page memd does not hold is made, zeros,
 * and charged to the quota grant (-ENOSPC: none left); without it, -ENOENT.
 * FM_PAGE_OVERWRITE: the caller writes every byte of the page before it
 * seals it (an object move covering it), so its old bytes are neither checked
 * nor zeroed; reading them is the caller's bug. The caller holds the page:
 * nobody else reads or writes it until it is sealed.
 */
#define FM_PAGE_CREATE 1u
#define FM_PAGE_OVERWRITE 2u
int fm_chan_page_open(struct fm_chan *c, uint32_t space, uint64_t page, unsigned flags, uint8_t **bytes);

/* The opened page's bytes are final: its checksum again, and memd holds it. */
int fm_chan_page_seal(struct fm_chan *c, uint32_t space, uint64_t page);

#endif /* FARMEM_TRANSPORT_H */
