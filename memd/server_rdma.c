// SPDX-License-Identifier: Apache-2.0
/*
 * memd's RDMA side (--rdma ADDR:PORT). One thread runs a librdmacm listener:
 * it accepts RC connections and gives each its own QP, then takes no further
 * part in the data path: clients read and write spaces with one-sided verbs.
 *
 * A client learns a region (address, rkey, length) only through RDMA_MAP on
 * its authenticated TCP control connection (same port number, docs/protocol.md
 * "RDMA"); the region is the space's memfd, mapped here and registered with
 * ibv_reg_mr (which pins it). A QP that touches memory with a wrong rkey or
 * out of range is moved to the error state by the device; the client sees
 * its QP fail, and when it disconnects or exits we tear down that QP alone.
 */
#include "server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fm_util.h"

static struct {
	struct rdma_event_channel *ec;
	struct rdma_cm_id *lid;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	pthread_t th;
	int stop_fd[2];
	int running;
	pthread_mutex_t lock;
	unsigned long conns, lost;
} R = { .lock = PTHREAD_MUTEX_INITIALIZER, .stop_fd = { -1, -1 } };

int memd_rdma_map(int fd, const struct fm_shm_map_rep *shm, struct fm_rdma_map_rep *rep)
{
	struct ibv_mr *mr;
	void *p;

	if (!R.running)
		return -EOPNOTSUPP;
	p = mmap(NULL, shm->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	/*
	 * Pins the whole space. The mapping and the registration live until
	 * memd exits (a closed space's pages stay pinned: keep RDMA spaces
	 * sized to the job).
	 */
	pthread_mutex_lock(&R.lock);
	mr = ibv_reg_mr(R.pd, p, shm->map_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	pthread_mutex_unlock(&R.lock);
	if (!mr) {
		int e = errno;
		fm_warn("rdma: cannot register %zu bytes: %s", (size_t)shm->map_len, strerror(e));
		munmap(p, shm->map_len);
		return -e;
	}
	rep->npages = shm->npages;
	rep->data_offset = shm->data_offset;
	rep->meta_offset = shm->meta_offset;
	rep->map_len = shm->map_len;
	rep->addr = (uint64_t)(uintptr_t)p;
	rep->rkey = mr->rkey;
	rep->reserved = 0;
	return 0;
}

static void drop_conn(struct rdma_cm_id *id, const char *why)
{
	if (id->qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
	pthread_mutex_lock(&R.lock);
	R.lost++;
	pthread_mutex_unlock(&R.lock);
	fm_info("rdma: connection closed (%s)", why);
}

static void accept_conn(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = R.cq, .recv_cq = R.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct rdma_conn_param cp = { .responder_resources = 16, .initiator_depth = 0,
				      .rnr_retry_count = 7 };
	struct ibv_device_attr da;

	if (id->verbs != R.pd->context) {
		fm_warn("rdma: connection on another device: rejected");
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return;
	}
	if (!ibv_query_device(id->verbs, &da) && da.max_qp_rd_atom < cp.responder_resources)
		cp.responder_resources = (uint8_t)da.max_qp_rd_atom;
	if (rdma_create_qp(id, R.pd, &qa)) {
		fm_warn("rdma: cannot create a QP: %s", strerror(errno));
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return;
	}
	if (rdma_accept(id, &cp)) {
		fm_warn("rdma: accept: %s", strerror(errno));
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
	}
}

static void *rdma_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct pollfd p[2] = { { .fd = R.ec->fd, .events = POLLIN },
				       { .fd = R.stop_fd[0], .events = POLLIN } };
		struct rdma_cm_event *ev;
		struct rdma_cm_id *id;
		enum rdma_cm_event_type t;

		if (poll(p, 2, -1) < 0)
			continue;
		if (p[1].revents)
			break;
		if (rdma_get_cm_event(R.ec, &ev))
			continue;
		id = ev->id;
		t = ev->event;
		rdma_ack_cm_event(ev);
		switch (t) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			accept_conn(id);
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			pthread_mutex_lock(&R.lock);
			R.conns++;
			pthread_mutex_unlock(&R.lock);
			fm_debug("rdma: connection established");
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			rdma_disconnect(id);
			drop_conn(id, "peer disconnected");
			break;
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_REJECTED:
			drop_conn(id, rdma_event_str(t));
			break;
		default:
			break;
		}
	}
	return NULL;
}

int memd_rdma_start(const char *spec)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	int rc;

	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host)) {
		fm_err("--rdma: want ADDR:PORT, not '%s'", spec);
		return -EINVAL;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = 0;
	rc = getaddrinfo(host, colon + 1, &hints, &ai);
	if (rc) {
		fm_err("--rdma %s: %s", spec, gai_strerror(rc));
		return -EINVAL;
	}
	R.ec = rdma_create_event_channel();
	if (!R.ec || rdma_create_id(R.ec, &R.lid, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(R.lid, ai->ai_addr) || rdma_listen(R.lid, 64)) {
		rc = -errno;
		fm_err("--rdma %s: cannot listen (is there an RDMA device on that address?): %s", spec,
		       strerror(errno));
		goto fail;
	}
	if (!R.lid->verbs) {
		rc = -ENODEV;
		fm_err("--rdma %s: bind a specific address (with an RDMA device), not a wildcard", spec);
		goto fail;
	}
	R.pd = ibv_alloc_pd(R.lid->verbs);
	R.cq = R.pd ? ibv_create_cq(R.lid->verbs, 64, NULL, NULL, 0) : NULL;
	if (!R.cq || pipe(R.stop_fd)) {
		rc = -errno;
		fm_err("--rdma %s: %s", spec, strerror(errno));
		goto fail;
	}
	R.running = 1;
	rc = -pthread_create(&R.th, NULL, rdma_main, NULL);
	if (rc) {
		R.running = 0;
		goto fail;
	}
	freeaddrinfo(ai);
	fm_info("rdma: listening on %s (device %s); control over TCP on the same port", spec,
		ibv_get_device_name(R.lid->verbs->device));
	return 0;
fail:
	freeaddrinfo(ai);
	return rc ? rc : -EIO;
}

void memd_rdma_stop(void)
{
	if (!R.running)
		return;
	if (write(R.stop_fd[1], "x", 1) == 1)
		pthread_join(R.th, NULL);
	R.running = 0;
}
