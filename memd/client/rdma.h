/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rdma transport's test hooks, for the qemu lane's hostile peer
 * (tests/vm/rdma_peer.c); the transport itself is reached through
 * transport.h ("rdma://ADDR:PORT", rdma.c). Control (HELLO/AUTH/SESSION/
 * SPACE_OPEN/QUOTA/RDMA_MAP/COPY) goes over TCP to ADDR:PORT; page data
 * moves with one-sided RDMA READ/WRITE over one RC QP per channel,
 * connected with librdmacm to the same ADDR:PORT.
 */
#ifndef FARMEM_CLIENT_RDMA_H
#define FARMEM_CLIENT_RDMA_H

#include <stdint.h>
#include "transport.h"

/* One RDMA READ of len bytes at any remote address with any rkey: -EIO when the device refused it. */
int fm_rdma_test_raw_read(struct fm_chan *c, uint64_t raddr, uint32_t rkey, uint32_t len);
/* A space's region (its first chunk's, registered now if need be): its data address, pages and rkey. */
int fm_rdma_test_region(struct fm_xport *x, uint32_t space, uint64_t *data_addr, uint64_t *npages,
			uint32_t *rkey);

#endif /* FARMEM_CLIENT_RDMA_H */
