/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pages lent to another process's system call: process_vm_readv and
 * process_vm_writev of this process's paged memory (an MPI library's
 * single-copy transfer between ranks, stress-ng's vm-rw).
 *
 * Where faults raise SIGBUS, the kernel cannot wait for a page that another
 * process's call touches here: the call fails with EFAULT, and nothing in
 * the calling process can make the page resident. So a pager that serves
 * faults in the faulting thread listens on an abstract Unix socket named
 * after its process (FM_LEND_NAME), and the shim's cover of those calls in
 * the caller (preload_vm.c) asks it to make the ranges resident and to pin
 * them while the call runs. A connection holds one request's pins at a time:
 * the next request, or the connection's end, gives them back. Only a peer of
 * the same user, or root, is served.
 */
#ifndef FARMEM_LEND_H
#define FARMEM_LEND_H

#include <stdint.h>
#include <sys/types.h>

#define FM_LEND_NAME   "farmem-lend-%d" /* abstract socket, by pid */
#define FM_LEND_MAGIC  0x444e454cu      /* "LEND" */
#define FM_LEND_RANGES 16
/* What one request may make resident past the lender's budget. */
#define FM_LEND_BYTES  (4u << 20)

struct fm_lend_range {
	uint64_t addr;
	uint64_t len;
};

/* One SOCK_SEQPACKET message: the header and n ranges, no more. */
struct fm_lend_request {
	uint32_t magic;
	uint32_t n;
	uint32_t write; /* 1: the caller's call writes these pages */
	uint32_t pad;
	struct fm_lend_range r[FM_LEND_RANGES];
};

struct fm_lend_reply {
	uint32_t magic;
	int32_t status; /* 0: lent (the ranges in no paged memory pin nothing); -errno: refused */
	uint32_t pinned; /* pins the lender holds for the request */
	uint32_t pad;
};

struct fm_pager;
struct iovec;

/* The lender's side, in the pager (fault=signal only): 0, or -errno when it could not start. */
int fm_lend_start(struct fm_pager *p);
void fm_lend_stop(struct fm_pager *p);
/* A fork's child: the parent's socket and connections are not its own. */
void fm_lend_forget(struct fm_pager *p);

/* The caller's side: a connection to process pid's lender, or -1 when it has none. */
int fm_lend_connect(pid_t pid);
/* Ask for the ranges v[0..n) (n <= FM_LEND_RANGES, FM_LEND_BYTES in all): 0 when lent, -1 when not. */
int fm_lend_ask(int fd, const struct iovec *v, unsigned n, int write);

#endif
