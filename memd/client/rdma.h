/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rdma transport (client_rdma.c) behind transport.h: "rdma://ADDR:PORT".
 * Control (HELLO/AUTH/SESSION/SPACE_OPEN/QUOTA/RDMA_MAP) goes over TCP to
 * ADDR:PORT; page data moves with one-sided RDMA READ/WRITE over one RC QP
 * per channel, connected with librdmacm to the same ADDR:PORT.
 */
#ifndef FARMEM_CLIENT_RDMA_H
#define FARMEM_CLIENT_RDMA_H

#include "conn.h"

/* "rdma://ADDR:PORT": set up x->rdma and point x->cfg.addr at the TCP control address. */
int fm_rdma_init(struct fm_xport *x, const char *addr, char *err, size_t errlen);
void fm_rdma_free(struct fm_xport *x);
int fm_rdma_space_map(struct fm_xport *x, uint32_t id, uint64_t npages);
void fm_rdma_space_unmap(struct fm_xport *x, uint32_t id);
int fm_rdma_chan_open(struct fm_chan *c);
void fm_rdma_chan_close(struct fm_chan *c);
int fm_rdma_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		 const void **src);
int fm_rdma_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		  const void *const *data, uint32_t *status);
int fm_rdma_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n);
int fm_rdma_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status);

/* Test hooks for the lane's hostile peer (tests/vm/rdma_peer.c). */
int fm_rdma_test_raw_read(struct fm_chan *c, uint64_t raddr, uint32_t rkey, uint32_t len);
int fm_rdma_test_region(struct fm_xport *x, uint32_t space, uint64_t *data_addr, uint64_t *npages,
			uint32_t *rkey);

/* client_xport.c helpers the rdma transport shares with shm. */
int fm_xport_ctrl_call(struct fm_xport *x, uint16_t op, const void *req, size_t reqlen,
		       void *rep, size_t cap, size_t *len, uint16_t *st);
/* COPY over the control connection (fm_chan_copy's statuses and returns). */
int fm_xport_ctrl_copy(struct fm_xport *x, uint32_t src, const uint64_t *spages, uint32_t dst,
		       const uint64_t *dpages, unsigned n, uint32_t *status);
int fm_xport_take_grant(struct fm_xport *x);
void fm_xport_return_grant(struct fm_xport *x, uint64_t pages);

#endif /* FARMEM_CLIENT_RDMA_H */
