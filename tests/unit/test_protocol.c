// SPDX-License-Identifier: Apache-2.0
/*
 * Unit test of memd's protocol engine (memd/server/conn.c) and page store
 * (memd/server/store.c), built with ASan and UBSan. Connections are driven
 * on byte buffers (fd -1): frames go in with memd_conn_feed, replies are
 * taken off the reply queue. One test runs a connection over a socketpair
 * to check real I/O, fd passing and back-pressure.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "fm_util.h"
#include "protocol.h"
#include "server.h"

static const char SECRET[] = "unit-test-secret";
static int checks;

#define CHECK(cond, ...) do {                                                   \
	checks++;                                                               \
	if (!(cond)) {                                                          \
		fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
		fprintf(stderr, __VA_ARGS__);                                   \
		fputc('\n', stderr);                                            \
		exit(1);                                                        \
	}                                                                       \
} while (0)

/* ---- helpers ---------------------------------------------------------- */

struct rep {
	struct fm_hdr h;
	uint8_t *payload;   /* malloc'd, h.len bytes */
	int fd;             /* passed fd or -1 */
};

static uint64_t next_req = 1;

static void send_frame(struct memd_conn *c, uint16_t op, uint32_t count, const void *pl,
		       uint32_t len, uint64_t *req_id)
{
	struct fm_hdr h = { FM_PROTO_MAGIC, op, 0, next_req++, count, len };

	if (req_id)
		*req_id = h.req_id;
	CHECK(memd_conn_feed(c, &h, sizeof(h)) == 0, "feed");
	if (len)
		CHECK(memd_conn_feed(c, pl, len) == 0, "feed");
	CHECK(memd_conn_process(c) == 0, "process");
}

/* Take the first queued reply off the connection (the queue holds whole replies). */
static bool take_reply(struct memd_conn *c, struct rep *r)
{
	static uint8_t *acc;
	static size_t acc_len;
	static int acc_fd = -1;
	struct memd_txbuf *t;

	/* Flatten the queue into acc; an fd belongs to its buffer's first byte. */
	while ((t = c->tx_head)) {
		if (t->fd >= 0) {
			CHECK(acc_len == 0, "fd not at a reply boundary");
			acc_fd = t->fd;
			t->fd = -1;
		}
		acc = realloc(acc, acc_len + t->len - t->off);
		memcpy(acc + acc_len, t->data + t->off, t->len - t->off);
		acc_len += t->len - t->off;
		c->tx_head = t->next;
		free(t);
	}
	c->tx_tail = NULL;
	c->tx_bytes = 0;
	if (acc_len < sizeof(struct fm_hdr))
		return false;
	memcpy(&r->h, acc, sizeof(r->h));
	CHECK(r->h.magic == FM_PROTO_MAGIC, "reply magic");
	CHECK(acc_len >= sizeof(r->h) + r->h.len, "truncated reply");
	r->payload = malloc(r->h.len + 1);
	memcpy(r->payload, acc + sizeof(r->h), r->h.len);
	r->payload[r->h.len] = 0;
	r->fd = acc_fd;
	acc_fd = -1;
	acc_len -= sizeof(r->h) + r->h.len;
	memmove(acc, acc + sizeof(r->h) + r->h.len, acc_len);
	return true;
}

static void rep_free(struct rep *r)
{
	free(r->payload);
	r->payload = NULL;
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

/* Send one request and return its reply, which must echo req_id. */
static struct rep call(struct memd_conn *c, uint16_t op, uint32_t count, const void *pl,
		       uint32_t len)
{
	struct rep r;
	uint64_t id;

	send_frame(c, op, count, pl, len, &id);
	CHECK(take_reply(c, &r), "no reply to op %u", op);
	CHECK(r.h.req_id == id, "req_id %llu, want %llu", (unsigned long long)r.h.req_id,
	      (unsigned long long)id);
	return r;
}

static void expect_error(struct memd_conn *c, uint16_t op, uint32_t count, const void *pl,
			 uint32_t len, uint16_t status, bool closes)
{
	struct rep r = call(c, op, count, pl, len);

	CHECK(r.h.op == FM_OP_ERROR, "op %u: reply op %u, want an error", op, r.h.op);
	CHECK(r.h.status == status, "op %u: status %u, want %u (%s)", op, r.h.status, status,
	      (char *)r.payload);
	CHECK(c->closing == closes, "op %u: closing %d, want %d", op, c->closing, closes);
	rep_free(&r);
}

static struct rep expect_ok(struct memd_conn *c, uint16_t op, uint32_t count, const void *pl,
			    uint32_t len)
{
	struct rep r = call(c, op, count, pl, len);

	CHECK(r.h.op == op && r.h.status == FM_OK, "op %u failed: op %u status %u: %s", op,
	      r.h.op, r.h.status, (char *)r.payload);
	return r;
}

static void handshake(struct memd_conn *c)
{
	struct fm_hello_req hr = { 1, 1, 0, { 0 } };
	struct fm_hello_rep hp;
	struct fm_auth_req ar;
	uint8_t want[FM_MAC_LEN];
	struct rep r;

	fm_random(hr.client_nonce, FM_NONCE_LEN);
	r = expect_ok(c, FM_OP_HELLO, 0, &hr, sizeof(hr));
	CHECK(r.h.len == sizeof(hp), "hello len");
	memcpy(&hp, r.payload, sizeof(hp));
	CHECK(hp.version == 1, "version");
	CHECK(!!(hp.flags & FM_HELLO_F_SHM) == c->is_unix, "shm flag");
	CHECK(!!(hp.flags & FM_HELLO_F_ALLOC) == c->is_unix, "alloc flag");
	rep_free(&r);
	fm_auth_client_mac(SECRET, strlen(SECRET), hp.server_nonce, hr.client_nonce, ar.mac);
	r = expect_ok(c, FM_OP_AUTH, 0, &ar, sizeof(ar));
	fm_auth_server_mac(SECRET, strlen(SECRET), hp.server_nonce, hr.client_nonce, want);
	CHECK(r.h.len == FM_MAC_LEN && memcmp(r.payload, want, FM_MAC_LEN) == 0, "server mac");
	rep_free(&r);
}

static void conn_open(struct memd_conn *c, struct memd_store *st, bool is_unix)
{
	memd_conn_init(c, st, SECRET, strlen(SECRET), -1, is_unix);
	handshake(c);
}

static struct fm_session new_session(struct memd_conn *c)
{
	struct fm_session s;
	struct rep r = expect_ok(c, FM_OP_SESSION_NEW, 0, NULL, 0);

	CHECK(r.h.len == sizeof(s), "session len");
	memcpy(&s, r.payload, sizeof(s));
	rep_free(&r);
	return s;
}

static uint32_t space_open(struct memd_conn *c, uint64_t npages)
{
	struct fm_space_open_req q = { npages, 0, 0 };
	struct fm_space_open_rep p;
	struct rep r = expect_ok(c, FM_OP_SPACE_OPEN, 0, &q, sizeof(q));

	memcpy(&p, r.payload, sizeof(p));
	rep_free(&r);
	return p.space_id;
}

static void fill_page(uint8_t *p, uint64_t page, unsigned salt)
{
	for (unsigned i = 0; i < FM_PAGE_SIZE; i++)
		p[i] = (uint8_t)(page * 131 + i * 7 + salt);
}

/* WRITE n pages (page numbers given); bad_crc marks entries sent with a wrong crc. */
static void write_pages(struct memd_conn *c, uint32_t space, const uint64_t *pages,
			unsigned n, unsigned salt, const bool *bad_crc, uint32_t *status)
{
	size_t len = sizeof(struct fm_space_ref) + n * (sizeof(struct fm_write_ent) + FM_PAGE_SIZE);
	uint8_t *pl = calloc(1, len), *data;
	struct fm_space_ref ref = { space, 0 };
	struct rep r;

	memcpy(pl, &ref, sizeof(ref));
	data = pl + sizeof(ref) + n * sizeof(struct fm_write_ent);
	for (unsigned i = 0; i < n; i++) {
		struct fm_write_ent e = { pages[i], 0, 0 };

		fill_page(data + i * FM_PAGE_SIZE, pages[i], salt);
		e.crc = fm_crc32c(data + i * FM_PAGE_SIZE, FM_PAGE_SIZE);
		if (bad_crc && bad_crc[i])
			e.crc ^= 1;
		memcpy(pl + sizeof(ref) + i * sizeof(e), &e, sizeof(e));
	}
	r = expect_ok(c, FM_OP_WRITE, n, pl, (uint32_t)len);
	CHECK(r.h.count == n && r.h.len == n * 4, "write reply shape");
	memcpy(status, r.payload, n * 4);
	rep_free(&r);
	free(pl);
}

/* READ pages; checks that OK pages hold what fill_page(salt) wrote. */
static void read_pages(struct memd_conn *c, uint32_t space, const uint64_t *pages, unsigned n,
		       unsigned salt, uint32_t *status)
{
	size_t len = sizeof(struct fm_space_ref) + n * 8;
	uint8_t *pl = malloc(len), want[FM_PAGE_SIZE];
	struct fm_space_ref ref = { space, 0 };
	struct rep r;

	memcpy(pl, &ref, sizeof(ref));
	memcpy(pl + sizeof(ref), pages, n * 8);
	r = expect_ok(c, FM_OP_READ, n, pl, (uint32_t)len);
	CHECK(r.h.count == n && r.h.len == n * (8 + FM_PAGE_SIZE), "read reply shape");
	for (unsigned i = 0; i < n; i++) {
		struct fm_page_status ps;
		const uint8_t *d = r.payload + n * 8 + i * FM_PAGE_SIZE;

		memcpy(&ps, r.payload + i * 8, sizeof(ps));
		status[i] = ps.status;
		if (ps.status == FM_OK) {
			fill_page(want, pages[i], salt);
			CHECK(memcmp(d, want, FM_PAGE_SIZE) == 0, "page %llu data",
			      (unsigned long long)pages[i]);
			CHECK(ps.crc == fm_crc32c(d, FM_PAGE_SIZE), "page crc");
		} else {
			for (unsigned j = 0; j < FM_PAGE_SIZE; j++)
				CHECK(d[j] == 0, "non-OK page must read as zeros");
		}
	}
	rep_free(&r);
	free(pl);
}

static struct fm_stats stats(struct memd_conn *c)
{
	struct fm_stats s;
	struct rep r = expect_ok(c, FM_OP_STATS, 0, NULL, 0);

	CHECK(r.h.len == sizeof(s), "stats len");
	memcpy(&s, r.payload, sizeof(s));
	rep_free(&r);
	return s;
}

static void discard(struct memd_conn *c, uint32_t space, uint64_t first, uint64_t n)
{
	struct { struct fm_space_ref ref; struct fm_range r; } __attribute__((packed)) q =
		{ { space, 0 }, { first, n } };
	struct rep r = expect_ok(c, FM_OP_DISCARD, 1, &q, sizeof(q));

	rep_free(&r);
}

/* COPY pairs from space src to dst; the reply's statuses into status. */
static void copy_pages(struct memd_conn *c, uint32_t src, uint32_t dst, const uint64_t *sp,
		       const uint64_t *dp, unsigned n, uint32_t *status)
{
	size_t len = sizeof(struct fm_copy_req) + n * sizeof(struct fm_copy_ent);
	uint8_t *pl = malloc(len);
	struct fm_copy_req q = { src, dst };
	struct rep r;

	memcpy(pl, &q, sizeof(q));
	for (unsigned i = 0; i < n; i++) {
		struct fm_copy_ent e = { sp[i], dp[i] };

		memcpy(pl + sizeof(q) + i * sizeof(e), &e, sizeof(e));
	}
	r = expect_ok(c, FM_OP_COPY, n, pl, (uint32_t)len);
	CHECK(r.h.count == n && r.h.len == n * 4, "copy reply shape");
	memcpy(status, r.payload, n * 4);
	rep_free(&r);
	free(pl);
}

static void drop_queue(struct memd_conn *c)
{
	struct rep r;

	while (take_reply(c, &r))
		rep_free(&r);
}

/* ---- tests ------------------------------------------------------------ */

static void test_frame_check(void)
{
	struct { uint32_t magic; uint16_t op; uint32_t count, len; int state, verdict; uint16_t st; }
	cases[] = {
		{ 0xdeadbeef, FM_OP_HELLO, 0, 40, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_HELLO, 0, FM_MAX_PAYLOAD + 1, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_HELLO, 0, 40, MEMD_C_HELLO, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_HELLO, 0, 39, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_HELLO, 1, 40, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_STATS, 0, 0, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_AUTH },
		{ FM_PROTO_MAGIC, 999, 0, 0, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_AUTH },
		{ FM_PROTO_MAGIC, FM_OP_AUTH, 0, 32, MEMD_C_HELLO, MEMD_V_CLOSE, FM_E_STATE },
		{ FM_PROTO_MAGIC, FM_OP_AUTH, 0, 32, MEMD_C_AUTH, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_READ, 0, 8, MEMD_C_AUTH, MEMD_V_CLOSE, FM_E_AUTH },
		{ FM_PROTO_MAGIC, FM_OP_HELLO, 0, 40, MEMD_C_AUTH, MEMD_V_CLOSE, FM_E_STATE },
		{ FM_PROTO_MAGIC, FM_OP_HELLO, 0, 40, MEMD_C_READY, MEMD_V_CLOSE, FM_E_STATE },
		{ FM_PROTO_MAGIC, 0, 0, 0, MEMD_C_READY, MEMD_V_ERR, FM_E_OP },
		{ FM_PROTO_MAGIC, 19, 0, 100, MEMD_C_READY, MEMD_V_ERR, FM_E_OP },
		{ FM_PROTO_MAGIC, FM_OP_SHM_ALLOC, 1024, 8 + 1024 * 16, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_SHM_ALLOC, 1025, 8 + 1025 * 16, MEMD_C_READY, MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_SHM_ALLOC, 2, 8 + 16, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 256, 8 + 256 * 16, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 0, 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 257, 8 + 257 * 16, MEMD_C_READY, MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 0xffffffffu, 8, MEMD_C_READY, MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 2, 8 + 16, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 1, 8 + 16 + 1, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_COPY, 1, 24, MEMD_C_AUTH, MEMD_V_CLOSE, FM_E_AUTH },
		/* EDIT: bytes may follow its entries (PUT data), never fewer than the entries */
		{ FM_PROTO_MAGIC, FM_OP_EDIT, 2, 8 + 2 * 24, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_EDIT, 2, 8 + 2 * 24 + 100, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_EDIT, 2, 8 + 24, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_EDIT, FM_MAX_EDITS + 1, 8 + (FM_MAX_EDITS + 1) * 24, MEMD_C_READY,
		  MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_MAP, 0, 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_REG, FM_MAX_RDMA_REG, 8 + FM_MAX_RDMA_REG * 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_REG, FM_MAX_RDMA_REG + 1, 8 + (FM_MAX_RDMA_REG + 1) * 8, MEMD_C_READY,
		  MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_REG, 2, 8 + 8, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_UNREG, FM_MAX_RDMA_REG, 8 + FM_MAX_RDMA_REG * 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_UNREG, FM_MAX_RDMA_REG + 1, 8 + (FM_MAX_RDMA_REG + 1) * 8, MEMD_C_READY,
		  MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_RDMA_UNREG, 2, 8 + 8, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_ERROR, 0, 0, MEMD_C_READY, MEMD_V_ERR, FM_E_OP },
		{ FM_PROTO_MAGIC, FM_OP_READ, 256, 8 + 256 * 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_READ, 257, 8 + 257 * 8, MEMD_C_READY, MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_READ, 2, 20, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_WRITE, 256, 8 + 256 * 4112, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_WRITE, 1, 8 + 4112 - 1, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_DISCARD, 1024, 8 + 1024 * 16, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_DISCARD, 1025, 8 + 1025 * 16, MEMD_C_READY, MEMD_V_ERR, FM_E_TOOBIG },
		{ FM_PROTO_MAGIC, FM_OP_STATS, 1, 0, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_STATS, 0, 8, MEMD_C_READY, MEMD_V_CLOSE, FM_E_PROTO },
		{ FM_PROTO_MAGIC, FM_OP_QUOTA, 0, 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_SHM_MAP, 0, 8, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_SESSION_JOIN, 0, 24, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_SPACE_OPEN, 0, 16, MEMD_C_READY, MEMD_V_OK, 0 },
		{ FM_PROTO_MAGIC, FM_OP_SPACE_OPEN, 0, 0xffffffffu, MEMD_C_READY, MEMD_V_CLOSE, FM_E_TOOBIG },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fm_hdr h = { cases[i].magic, cases[i].op, 0, 42, cases[i].count, cases[i].len };
		struct memd_hdr d;
		uint16_t st = 0xffff;
		char msg[200];
		int v = memd_frame_check((const uint8_t *)&h, cases[i].state, &d, &st, msg, sizeof(msg));

		CHECK(v == cases[i].verdict, "case %zu: verdict %d, want %d (%s)", i, v,
		      cases[i].verdict, msg);
		CHECK(v == MEMD_V_OK ? st == FM_OK : st == cases[i].st,
		      "case %zu: status %u, want %u", i, st, cases[i].st);
		CHECK(v == MEMD_V_OK || msg[0], "case %zu: an error needs a message", i);
		CHECK(d.req_id == 42 && d.op == cases[i].op, "case %zu: decode", i);
	}
}

static void test_handshake(struct memd_store *st)
{
	struct memd_conn c;
	struct fm_hello_req hr = { 2, 3, 0, { 0 } };
	struct fm_auth_req ar = { { 0 } };
	struct rep r;

	/* No common version. */
	memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, false);
	expect_error(&c, FM_OP_HELLO, 0, &hr, sizeof(hr), FM_E_VERSION, true);
	memd_conn_fini(&c);
	/* min > max is no range at all. */
	hr.min_version = 1;
	hr.max_version = 0;
	memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, false);
	expect_error(&c, FM_OP_HELLO, 0, &hr, sizeof(hr), FM_E_VERSION, true);
	memd_conn_fini(&c);
	/* A wide range that includes 1 is fine. */
	hr.min_version = 0;
	hr.max_version = 7;
	memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, false);
	r = expect_ok(&c, FM_OP_HELLO, 0, &hr, sizeof(hr));
	rep_free(&r);
	/* Wrong mac: error and close; nothing after it is run. */
	send_frame(&c, FM_OP_AUTH, 0, &ar, sizeof(ar), NULL);
	send_frame(&c, FM_OP_STATS, 0, NULL, 0, NULL);
	CHECK(take_reply(&c, &r), "auth reply");
	CHECK(r.h.op == FM_OP_ERROR && r.h.status == FM_E_AUTH && c.closing, "bad mac");
	rep_free(&r);
	CHECK(!take_reply(&c, &r), "nothing may follow a closing error");
	CHECK(memd_conn_done(&c), "done after the error");
	memd_conn_fini(&c);

	/* Ops before authentication close the connection. */
	memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, false);
	expect_error(&c, FM_OP_STATS, 0, NULL, 0, FM_E_AUTH, true);
	memd_conn_fini(&c);
	memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, false);
	expect_error(&c, FM_OP_AUTH, 0, &ar, sizeof(ar), FM_E_STATE, true);
	memd_conn_fini(&c);
	/* Authenticated without a session: STATS yes, space ops no (and stay open). */
	conn_open(&c, st, false);
	r = expect_ok(&c, FM_OP_STATS, 0, NULL, 0);
	rep_free(&r);
	{
		struct fm_space_open_req q = { 8, 0, 0 };

		expect_error(&c, FM_OP_SPACE_OPEN, 0, &q, sizeof(q), FM_E_STATE, false);
	}
	new_session(&c);
	expect_error(&c, FM_OP_SESSION_NEW, 0, NULL, 0, FM_E_STATE, false);
	expect_error(&c, 77, 0, "xyz", 3, FM_E_OP, false);
	r = expect_ok(&c, FM_OP_STATS, 0, NULL, 0);
	rep_free(&r);
	memd_conn_fini(&c);
}

static void test_pages(struct memd_store *st)
{
	struct memd_conn c, c2;
	uint64_t pages[4] = { 0, 5, 15, 16 }, rd[5] = { 0, 5, 15, 16, 7 };
	bool bad[4] = { false, true, false, false };
	uint32_t s[5], sp;
	struct fm_stats fs;
	struct fm_session sess;

	conn_open(&c, st, false);
	sess = new_session(&c);
	sp = space_open(&c, 16);
	CHECK(sp != 0, "space id");
	write_pages(&c, sp, pages, 4, 1, bad, s);
	CHECK(s[0] == FM_OK && s[1] == FM_E_CRC && s[2] == FM_OK && s[3] == FM_E_RANGE,
	      "write statuses %u %u %u %u", s[0], s[1], s[2], s[3]);
	read_pages(&c, sp, rd, 5, 1, s);
	CHECK(s[0] == FM_OK && s[1] == FM_E_ABSENT && s[2] == FM_OK && s[3] == FM_E_RANGE &&
	      s[4] == FM_E_ABSENT, "read statuses %u %u %u %u %u", s[0], s[1], s[2], s[3], s[4]);
	fs = stats(&c);
	CHECK(fs.used_pages == 2 && fs.spaces == 1 && fs.sessions == 1, "stats used %llu",
	      (unsigned long long)fs.used_pages);

	/* A second connection joins the session and sees the same pages. */
	memd_conn_init(&c2, st, SECRET, strlen(SECRET), -1, false);
	handshake(&c2);
	{
		struct rep r = expect_ok(&c2, FM_OP_SESSION_JOIN, 0, &sess, sizeof(sess));

		rep_free(&r);
	}
	read_pages(&c2, sp, rd, 3, 1, s);
	CHECK(s[0] == FM_OK && s[2] == FM_OK, "joined read");
	/* Overwrite does not count again. */
	write_pages(&c2, sp, pages, 1, 9, NULL, s);
	CHECK(s[0] == FM_OK, "overwrite");
	read_pages(&c, sp, pages, 1, 9, s);
	CHECK(s[0] == FM_OK, "overwritten read");
	CHECK(stats(&c).used_pages == 2, "overwrite is not new");

	/* Discard: pages read as absent and capacity comes back. */
	discard(&c, sp, 0, 16);
	read_pages(&c, sp, rd, 3, 1, s);
	CHECK(s[0] == FM_E_ABSENT && s[2] == FM_E_ABSENT, "discarded");
	CHECK(stats(&c).used_pages == 0, "discard frees");
	{
		struct { struct fm_space_ref ref; struct fm_range r[2]; } __attribute__((packed)) q =
			{ { sp, 0 }, { { 0, 1 }, { 10, 7 } } };

		expect_error(&c, FM_OP_DISCARD, 2, &q, sizeof(q), FM_E_RANGE, false);
		q.r[1].first = 1ull << 63;
		q.r[1].npages = 1ull << 63;
		expect_error(&c, FM_OP_DISCARD, 2, &q, sizeof(q), FM_E_RANGE, false);
	}

	/* Space bounds. */
	{
		struct fm_space_open_req q = { 0, 0, 0 };

		expect_error(&c, FM_OP_SPACE_OPEN, 0, &q, sizeof(q), FM_E_RANGE, false);
		q.npages = FM_MAX_SPACE_PAGES + 1;
		expect_error(&c, FM_OP_SPACE_OPEN, 0, &q, sizeof(q), FM_E_RANGE, false);
		/* Legal, but beyond memd's address space budget. */
		q.npages = FM_MAX_SPACE_PAGES;
		expect_error(&c, FM_OP_SPACE_OPEN, 0, &q, sizeof(q), FM_E_FULL, false);
	}
	/* A large sparse space costs nothing until written; a far page works. */
	{
		uint32_t big = space_open(&c, 1ull << 30);
		uint64_t far[2] = { (1ull << 30) - 1, 123456789 };

		write_pages(&c, big, far, 1, 3, NULL, s);
		CHECK(s[0] == FM_OK, "far write");
		read_pages(&c, big, far, 2, 3, s);
		CHECK(s[0] == FM_OK && s[1] == FM_E_ABSENT, "far read");
		discard(&c, big, 0, 1ull << 30);
		read_pages(&c, big, far, 1, 3, s);
		CHECK(s[0] == FM_E_ABSENT, "far discard");
	}

	/* Close: the id is gone for both connections. */
	{
		struct fm_space_ref ref = { sp, 0 };
		struct rep r = expect_ok(&c, FM_OP_SPACE_CLOSE, 0, &ref, sizeof(ref));

		rep_free(&r);
		expect_error(&c2, FM_OP_SPACE_CLOSE, 0, &ref, sizeof(ref), FM_E_NOSPACE, false);
		expect_error(&c2, FM_OP_SHM_MAP, 0, &ref, sizeof(ref), FM_E_NOSHM, false);
	}
	memd_conn_fini(&c2);
	memd_conn_fini(&c);
	CHECK(st->nsessions == 0 && st->nspaces == 0 && st->used == 0 && st->va_used == 0,
	      "session death frees everything");
}

static void test_capacity_and_isolation(void)
{
	struct memd_store st;
	struct memd_conn a, b, b2;
	uint64_t p6[6] = { 0, 1, 2, 3, 4, 5 };
	uint32_t s[6], spa, spb;
	struct fm_session sb;
	int ok = 0, full = 0;

	CHECK(memd_store_init(&st, 4, 3) == 0, "init");
	conn_open(&a, &st, false);
	new_session(&a);
	spa = space_open(&a, 64);
	/* Session quota is 3 pages, capacity 4. */
	write_pages(&a, spa, p6, 6, 1, NULL, s);
	for (int i = 0; i < 6; i++) {
		ok += s[i] == FM_OK;
		full += s[i] == FM_E_FULL;
	}
	CHECK(ok == 3 && full == 3, "quota: %d ok %d full", ok, full);
	CHECK(stats(&a).full_rejects == 3, "full_rejects");
	/* Overwrites of present pages still work when full. */
	write_pages(&a, spa, p6, 3, 2, NULL, s);
	CHECK(s[0] == FM_OK && s[1] == FM_OK && s[2] == FM_OK, "overwrite when full");

	conn_open(&b, &st, false);
	sb = new_session(&b);
	spb = space_open(&b, 64);
	write_pages(&b, spb, p6, 2, 5, NULL, s);
	CHECK(s[0] == FM_OK && s[1] == FM_E_FULL, "capacity 4: b gets one page");
	CHECK(stats(&b).used_pages == 4, "used 4");
	/* Discard in a frees room for b. */
	discard(&a, spa, 0, 2);
	write_pages(&b, spb, p6 + 1, 2, 5, NULL, s);
	CHECK(s[0] == FM_OK && s[1] == FM_OK, "room after discard");

	/* Isolation: b names a's space id (both are 1: ids are per session). */
	{
		uint32_t other = spa + 1000;
		struct fm_space_ref ref = { other, 0 };
		uint8_t rq[16];
		struct { struct fm_space_ref ref; struct fm_range r; } __attribute__((packed)) dq =
			{ { other, 0 }, { 0, 1 } };

		memcpy(rq, &ref, 8);
		memset(rq + 8, 0, 8);
		expect_error(&b, FM_OP_READ, 1, rq, sizeof(rq), FM_E_NOSPACE, false);
		expect_error(&b, FM_OP_DISCARD, 1, &dq, sizeof(dq), FM_E_NOSPACE, false);
	}
	/* A wrong key is refused, the right one joins. */
	conn_open(&b2, &st, false);
	sb.key[0] ^= 0xff;
	expect_error(&b2, FM_OP_SESSION_JOIN, 0, &sb, sizeof(sb), FM_E_AUTH, false);
	sb.session_id ^= 1;
	sb.key[0] ^= 0xff;
	expect_error(&b2, FM_OP_SESSION_JOIN, 0, &sb, sizeof(sb), FM_E_AUTH, false);
	memd_conn_fini(&b2);

	/* QUOTA: bounded by capacity and the session quota; releases clamp at 0. */
	{
		int64_t d = 100;
		struct rep r;
		struct fm_quota_rep qr;

		memd_conn_fini(&b);       /* b's session dies: 3 pages come back */
		CHECK(st.used == 1, "b's pages freed: used %llu", (unsigned long long)st.used);
		r = expect_ok(&a, FM_OP_QUOTA, 0, &d, sizeof(d));
		memcpy(&qr, r.payload, sizeof(qr));
		rep_free(&r);
		/* a holds 1 page: its quota of 3 leaves 2 (capacity would allow 3). */
		CHECK(qr.granted_pages == 2, "grant %llu", (unsigned long long)qr.granted_pages);
		CHECK(st.used == 3, "grant counts as used");
		d = INT64_MIN;
		r = expect_ok(&a, FM_OP_QUOTA, 0, &d, sizeof(d));
		memcpy(&qr, r.payload, sizeof(qr));
		rep_free(&r);
		CHECK(qr.granted_pages == 0 && st.used == 1, "release all");
	}
	memd_conn_fini(&a);
	CHECK(st.used == 0 && st.nsessions == 0, "all freed");
	memd_store_fini(&st);
}

static void test_shm(void)
{
	struct memd_store st;
	struct memd_conn c;
	uint64_t pages[2] = { 3, 9 };
	uint32_t s[2], sp;
	struct fm_space_ref ref;
	struct fm_shm_map_rep mr;
	struct rep r;
	uint8_t *map;
	struct fm_shm_meta *meta;
	uint8_t want[FM_PAGE_SIZE];

	CHECK(memd_store_init(&st, 100, 100) == 0, "init");
	conn_open(&c, &st, true);
	new_session(&c);
	sp = space_open(&c, 1000);
	write_pages(&c, sp, pages, 1, 4, NULL, s);
	CHECK(s[0] == FM_OK && st.used == 1, "stream write before map");
	ref.space_id = sp;
	ref.reserved = 0;
	r = expect_ok(&c, FM_OP_SHM_MAP, 0, &ref, sizeof(ref));
	CHECK(r.fd >= 0, "SHM_MAP passes an fd");
	memcpy(&mr, r.payload, sizeof(mr));
	CHECK(mr.npages == 1000 && mr.data_offset == 0 && mr.meta_offset == 1000 * FM_PAGE_SIZE &&
	      mr.meta_offset % FM_PAGE_SIZE == 0 &&
	      mr.map_len == mr.meta_offset + 2 * FM_PAGE_SIZE, "layout");
	/* The pages present became the session's grant: used is unchanged. */
	CHECK(st.used == 1, "used after map %llu", (unsigned long long)st.used);
	CHECK(ftruncate(r.fd, 0) < 0, "the memfd is sealed against shrinking");
	map = mmap(NULL, mr.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
	CHECK(map != MAP_FAILED, "mmap");
	meta = (struct fm_shm_meta *)(map + mr.meta_offset);
	fill_page(want, 3, 4);
	CHECK(memcmp(map + 3 * FM_PAGE_SIZE, want, FM_PAGE_SIZE) == 0, "stream write visible");
	CHECK(__atomic_load_n(&meta[3].flags, __ATOMIC_ACQUIRE) == FM_SHM_PRESENT &&
	      meta[3].crc == fm_crc32c(want, FM_PAGE_SIZE), "meta of page 3");
	CHECK(meta[9].flags == 0, "page 9 absent");
	/* Write page 9 one-sided; memd serves it over the stream. */
	fill_page(map + 9 * FM_PAGE_SIZE, 9, 4);
	meta[9].crc = fm_crc32c(map + 9 * FM_PAGE_SIZE, FM_PAGE_SIZE);
	__atomic_store_n(&meta[9].flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
	/* And a page in a meta page memd never touched (page 600: second meta page). */
	fill_page(map + 600 * FM_PAGE_SIZE, 600, 4);
	meta[600].crc = fm_crc32c(map + 600 * FM_PAGE_SIZE, FM_PAGE_SIZE);
	__atomic_store_n(&meta[600].flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
	read_pages(&c, sp, pages, 2, 4, s);
	CHECK(s[0] == FM_OK && s[1] == FM_OK, "one-sided write read over the stream");
	{
		uint64_t p600 = 600, p999 = 999;

		read_pages(&c, sp, &p600, 1, 4, s);
		CHECK(s[0] == FM_OK, "page in a client-made meta page");
		read_pages(&c, sp, &p999, 1, 4, s);
		CHECK(s[0] == FM_E_ABSENT, "absent page");
	}
	discard(&c, sp, 9, 1);
	CHECK(meta[9].flags == 0, "discard clears the flags");
	rep_free(&r);
	munmap(map, mr.map_len);
	memd_conn_fini(&c);
	CHECK(st.used == 0, "grant returned at session end");
	memd_store_fini(&st);
}

/* Pages of memory in the memfd, data and meta (shmem counts what it allocated). */
static uint64_t memfd_pages(int fd)
{
	struct stat sb;

	CHECK(fstat(fd, &sb) == 0, "fstat");
	return (uint64_t)sb.st_blocks / (FM_PAGE_SIZE / 512);
}

/*
 * SHM_ALLOC: memd allocates slots of a mapped space (and their meta) in its
 * own memfd, never more than the session's grant and the spaces' meta, and
 * only for a space mapped over a Unix socket.
 */
static void test_shm_alloc(void)
{
	struct memd_store st;
	struct memd_conn c, tcp;
	struct { struct fm_space_ref ref; struct fm_range r[2]; } __attribute__((packed)) q;
	struct fm_quota_req grant = { 10 };
	uint32_t sp;
	uint64_t before;
	struct rep r, m;
	uint8_t *map;

	CHECK(memd_store_init(&st, 100, 100) == 0, "init");
	conn_open(&c, &st, true);
	new_session(&c);
	sp = space_open(&c, 1000);
	q.ref = (struct fm_space_ref){ .space_id = sp };
	q.r[0] = (struct fm_range){ 0, 8 };
	q.r[1] = (struct fm_range){ 600, 1 };
	expect_error(&c, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]), FM_E_STATE, false);
	m = expect_ok(&c, FM_OP_SHM_MAP, 0, &q.ref, sizeof(q.ref));
	r = expect_ok(&c, FM_OP_QUOTA, 0, &grant, sizeof(grant));
	rep_free(&r);
	CHECK(memfd_pages(m.fd) == 0, "a new space holds no memory");
	/* Eight slots and one in the second meta page: 9 data pages, 2 meta pages. */
	r = expect_ok(&c, FM_OP_SHM_ALLOC, 2, &q, sizeof(q));
	rep_free(&r);
	CHECK(memfd_pages(m.fd) == 11, "allocated %llu pages, want 11", (unsigned long long)memfd_pages(m.fd));
	/*
	 * A slot asked for again allocates nothing (fallocate keeps what is
	 * there), though memd counts it against the bound (11 + 1 <= 12): it
	 * cannot tell a slot it allocated from a hole (SEEK_DATA calls both
	 * holes), and a client asks only for slots it has no memory in.
	 */
	q.r[0] = (struct fm_range){ 3, 1 };
	r = expect_ok(&c, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]));
	rep_free(&r);
	CHECK(memfd_pages(m.fd) == 11, "a second SHM_ALLOC of the same slots allocates nothing");
	/* The client's writes into them allocate nothing more: the memory is memd's. */
	map = mmap(NULL, 1000 * FM_PAGE_SIZE + 2 * FM_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
	CHECK(map != MAP_FAILED, "mmap");
	before = memfd_pages(m.fd);
	for (uint64_t p = 0; p < 8; p++)
		fill_page(map + p * FM_PAGE_SIZE, p, 1);
	fill_page(map + 600 * FM_PAGE_SIZE, 600, 1);
	map[1000 * FM_PAGE_SIZE] = 1;
	map[1000 * FM_PAGE_SIZE + FM_PAGE_SIZE] = 1;
	CHECK(memfd_pages(m.fd) == before, "writes into allocated slots and meta allocate nothing");
	/* 11 held + 2 more > a grant of 10 and 2 meta pages: refused, nothing allocated. */
	q.r[0] = (struct fm_range){ 100, 2 };
	expect_error(&c, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]), FM_E_FULL, false);
	CHECK(memfd_pages(m.fd) == 11, "a refused SHM_ALLOC allocates nothing");
	/* One more fits: 11 + 1 = 12. */
	q.r[0] = (struct fm_range){ 100, 1 };
	r = expect_ok(&c, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]));
	rep_free(&r);
	CHECK(memfd_pages(m.fd) == 12, "allocated %llu pages, want 12", (unsigned long long)memfd_pages(m.fd));
	q.r[0] = (struct fm_range){ 999, 2 };
	expect_error(&c, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]), FM_E_RANGE, false);
	q.ref.space_id = sp + 100;
	expect_error(&c, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]), FM_E_NOSPACE, false);
	/* Over TCP there is no memfd to share, so nothing to allocate in it for the client. */
	conn_open(&tcp, &st, false);
	new_session(&tcp);
	q.ref.space_id = space_open(&tcp, 16);
	q.r[0] = (struct fm_range){ 0, 1 };
	expect_error(&tcp, FM_OP_SHM_ALLOC, 1, &q, sizeof(q.ref) + sizeof(q.r[0]), FM_E_NOSHM, false);
	memd_conn_fini(&tcp);
	munmap(map, 1000 * FM_PAGE_SIZE + 2 * FM_PAGE_SIZE);
	rep_free(&m);
	memd_conn_fini(&c);
	CHECK(st.used == 0 && st.nsessions == 0, "all freed");
	memd_store_fini(&st);
}

/*
 * COPY: bytes and crc slot to slot (READ checks both against fill_page), per
 * entry statuses, capacity, isolation, and a space mapped one-sided.
 */
static void test_copy(void)
{
	struct memd_store st;
	struct memd_conn a, b;
	uint64_t w[3] = { 0, 1, 2 }, sp[6] = { 0, 1, 9, 2, 64, 0 }, dp[6] = { 5, 6, 7, 64, 1, 5 };
	uint32_t s[6], sa, sa2, sb;

	CHECK(memd_store_init(&st, 6, 6) == 0, "init");
	conn_open(&a, &st, true);
	new_session(&a);
	sa = space_open(&a, 64);
	sa2 = space_open(&a, 64);
	write_pages(&a, sa, w, 3, 2, NULL, s);
	CHECK(s[0] == FM_OK && s[1] == FM_OK && s[2] == FM_OK && st.used == 3, "written");
	/* Page k of sa holds fill_page(k); copies keep the source's bytes and crc. */
	copy_pages(&a, sa, sa, sp, dp, 6, s);
	CHECK(s[0] == FM_OK && s[1] == FM_OK && s[2] == FM_E_ABSENT && s[3] == FM_E_RANGE &&
	      s[4] == FM_E_RANGE && s[5] == FM_OK, "copy statuses %u %u %u %u %u %u", s[0], s[1],
	      s[2], s[3], s[4], s[5]);
	CHECK(st.used == 5 && stats(&a).writes == 3 + 3, "copies are stored pages: used %llu",
	      (unsigned long long)st.used);
	{
		struct rep r;
		uint8_t pl[8 + 16];
		struct fm_page_status ps[2];
		uint8_t want[FM_PAGE_SIZE];
		uint64_t rp[2] = { 5, 6 };
		struct fm_space_ref ref = { sa, 0 };

		memcpy(pl, &ref, 8);
		memcpy(pl + 8, rp, 16);
		r = expect_ok(&a, FM_OP_READ, 2, pl, sizeof(pl));
		memcpy(ps, r.payload, sizeof(ps));
		fill_page(want, 0, 2);
		CHECK(ps[0].status == FM_OK && ps[0].crc == fm_crc32c(want, FM_PAGE_SIZE) &&
		      memcmp(r.payload + 16, want, FM_PAGE_SIZE) == 0, "page 5 holds page 0");
		fill_page(want, 1, 2);
		CHECK(ps[1].status == FM_OK && memcmp(r.payload + 16 + FM_PAGE_SIZE, want, FM_PAGE_SIZE) == 0,
		      "page 6 holds page 1");
		rep_free(&r);
	}
	/* Capacity 6, 5 used: one new destination fits, the next is refused and unchanged. */
	{
		uint64_t s2[3] = { 0, 1, 2 }, d2[3] = { 0, 1, 2 };

		copy_pages(&a, sa, sa2, s2, d2, 3, s);
		CHECK(s[0] == FM_OK && s[1] == FM_E_FULL && s[2] == FM_E_FULL && st.used == 6,
		      "full: %u %u %u", s[0], s[1], s[2]);
		read_pages(&a, sa2, d2, 2, 2, s);
		CHECK(s[0] == FM_OK && s[1] == FM_E_ABSENT, "a refused copy leaves nothing");
		/* Onto a present page: no room needed. */
		s2[0] = 2;
		copy_pages(&a, sa, sa2, s2, d2, 1, s);
		CHECK(s[0] == FM_OK && st.used == 6, "overwrite when full");
	}
	/* Another session: a's spaces are no spaces, on either side; the connection stays. */
	conn_open(&b, &st, false);
	new_session(&b);
	sb = space_open(&b, 8);
	{
		struct { struct fm_copy_req q; struct fm_copy_ent e; } __attribute__((packed)) f =
			{ { sa2, sb }, { 0, 0 } };

		CHECK(sb == sa, "ids are per session");
		expect_error(&b, FM_OP_COPY, 1, &f, sizeof(f), FM_E_NOSPACE, false);
		f.q = (struct fm_copy_req){ sb, sa2 };
		expect_error(&b, FM_OP_COPY, 1, &f, sizeof(f), FM_E_NOSPACE, false);
		f.q = (struct fm_copy_req){ sb, sb };
		copy_pages(&b, sb, sb, (uint64_t[]){ 0 }, (uint64_t[]){ 1 }, 1, s);
		CHECK(s[0] == FM_E_ABSENT, "b's own space is empty");
	}
	/* A mapped space: memd sees pages written one-sided and copies them; accounting is the grant's. */
	{
		struct fm_space_ref ref = { sa2, 0 };
		struct fm_shm_map_rep mr;
		struct rep r = expect_ok(&a, FM_OP_SHM_MAP, 0, &ref, sizeof(ref));
		uint8_t *map;
		struct fm_shm_meta *meta;
		uint64_t used = st.used;

		memcpy(&mr, r.payload, sizeof(mr));
		map = mmap(NULL, mr.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
		CHECK(map != MAP_FAILED, "mmap");
		meta = (struct fm_shm_meta *)(map + mr.meta_offset);
		fill_page(map + 40 * FM_PAGE_SIZE, 40, 2);
		meta[40].crc = fm_crc32c(map + 40 * FM_PAGE_SIZE, FM_PAGE_SIZE);
		__atomic_store_n(&meta[40].flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
		copy_pages(&a, sa2, sa2, (uint64_t[]){ 40 }, (uint64_t[]){ 41 }, 1, s);
		CHECK(s[0] == FM_OK && st.used == used, "one-sided page copied, no new accounting");
		CHECK(__atomic_load_n(&meta[41].flags, __ATOMIC_ACQUIRE) == FM_SHM_PRESENT &&
		      meta[41].crc == meta[40].crc &&
		      memcmp(map + 41 * FM_PAGE_SIZE, map + 40 * FM_PAGE_SIZE, FM_PAGE_SIZE) == 0,
		      "the copy is visible one-sided");
		munmap(map, mr.map_len);
		rep_free(&r);
	}
	/* A closed space is gone for COPY. */
	{
		struct fm_space_ref ref = { sa2, 0 };
		struct { struct fm_copy_req q; struct fm_copy_ent e; } __attribute__((packed)) f =
			{ { sa, sa2 }, { 0, 0 } };
		struct rep r = expect_ok(&a, FM_OP_SPACE_CLOSE, 0, &ref, sizeof(ref));

		rep_free(&r);
		expect_error(&a, FM_OP_COPY, 1, &f, sizeof(f), FM_E_NOSPACE, false);
	}
	memd_conn_fini(&b);
	memd_conn_fini(&a);
	CHECK(st.used == 0 && st.nsessions == 0, "all freed: used %llu", (unsigned long long)st.used);
	memd_store_fini(&st);
}

/* EDIT request: entries, then PUT bytes. Returns the reply (OK or an error). */
static struct rep edit_call(struct memd_conn *c, uint32_t space, const struct fm_edit_ent *e, unsigned n,
			    const void *put, size_t put_len)
{
	size_t len = 8 + n * sizeof(*e) + put_len;
	uint8_t *pl = calloc(1, len);
	struct fm_space_ref ref = { space, 0 };
	struct rep r;

	memcpy(pl, &ref, sizeof(ref));
	memcpy(pl + 8, e, n * sizeof(*e));
	if (put_len)
		memcpy(pl + 8 + n * sizeof(*e), put, put_len);
	r = call(c, FM_OP_EDIT, n, pl, (uint32_t)len);
	free(pl);
	return r;
}

static void expect_edit_error(struct memd_conn *c, uint32_t space, const struct fm_edit_ent *e, unsigned n,
			      const void *put, size_t put_len, uint16_t status, const char *what)
{
	struct rep r = edit_call(c, space, e, n, put, put_len);

	CHECK(r.h.op == FM_OP_ERROR && r.h.status == status, "%s: op %u status %u, want error %u (%s)", what,
	      r.h.op, r.h.status, status, r.h.op == FM_OP_ERROR ? (char *)r.payload : "");
	CHECK(!c->closing, "%s: an EDIT error keeps the connection", what);
	rep_free(&r);
}

/*
 * EDIT: MOVE, PUT and GET in order, all or nothing; bad entries, a page read
 * that memd does not hold, a damaged page and a full memd change nothing.
 */
static void test_edit(void)
{
	struct memd_store st;
	struct memd_conn a;
	uint64_t w[2] = { 0, 1 }, all[4] = { 0, 1, 2, 3 };
	uint32_t s[4], sa;
	uint8_t want[4][FM_PAGE_SIZE], got[FM_PAGE_SIZE];
	struct fm_stats before;

	CHECK(memd_store_init(&st, 4, 4) == 0, "init");
	conn_open(&a, &st, true);
	new_session(&a);
	sa = space_open(&a, 8);
	write_pages(&a, sa, w, 2, 3, NULL, s);
	CHECK(s[0] == FM_OK && s[1] == FM_OK, "written");
	fill_page(want[0], 0, 3);
	fill_page(want[1], 1, 3);
	memset(want[2], 0, FM_PAGE_SIZE);
	{
		/*
		 * Page 2 is new (zeros, then 100 bytes from page 1 and 8 PUT bytes); page 0's
		 * bytes 10.. slide down by 10 within the page; GET returns page 2's first 16 bytes
		 * after both, so it sees them.
		 */
		const uint64_t word = 0x1122334455667788ull;
		struct fm_edit_ent e[4] = {
			{ .kind = FM_EDIT_MOVE, .len = 100, .src = 1 * 4096 + 50, .dst = 2 * 4096 + 8 },
			{ .kind = FM_EDIT_PUT, .len = 8, .dst = 2 * 4096 },
			{ .kind = FM_EDIT_MOVE, .len = 4086, .src = 10, .dst = 0 },
			{ .kind = FM_EDIT_GET, .len = 16, .src = 2 * 4096 },
		};
		struct rep r = edit_call(&a, sa, e, 4, &word, 8);
		CHECK(r.h.op == FM_OP_EDIT && r.h.status == FM_OK && r.h.len == 16, "edit ok: op %u status %u len %u",
		      r.h.op, r.h.status, r.h.len);
		memmove(want[2] + 8, want[1] + 50, 100);
		memcpy(want[2], &word, 8);
		memmove(want[0], want[0] + 10, 4086);
		CHECK(r.payload && memcmp(r.payload, want[2], 16) == 0, "GET sees the earlier entries");
		rep_free(&r);
		CHECK(st.used == 3, "the new page is stored: used %llu", (unsigned long long)st.used);
	}
	/* READ checks data and crc against fill_page: compare by hand instead. */
	for (unsigned k = 0; k < 3; k++) {
		struct rep r;
		uint8_t pl[16];
		struct fm_space_ref ref = { sa, 0 };
		struct fm_page_status ps;
		memcpy(pl, &ref, 8);
		memcpy(pl + 8, &all[k], 8);
		r = expect_ok(&a, FM_OP_READ, 1, pl, 16);
		memcpy(&ps, r.payload, sizeof(ps));
		memcpy(got, r.payload + 8, FM_PAGE_SIZE);
		CHECK(ps.status == FM_OK && ps.crc == fm_crc32c(got, FM_PAGE_SIZE) && memcmp(got, want[k], FM_PAGE_SIZE) == 0,
		      "page %u after the edit", k);
		rep_free(&r);
	}
	before = stats(&a);
	{
		struct fm_edit_ent bad[] = {
			{ .kind = 9, .len = 8, .src = 0, .dst = 8 },                    /* unknown kind */
			{ .kind = FM_EDIT_MOVE, .len = 0, .src = 0, .dst = 8 },         /* empty */
			{ .kind = FM_EDIT_MOVE, .len = 4097, .src = 0, .dst = 4096 },   /* more than a page */
			{ .kind = FM_EDIT_MOVE, .len = 16, .src = 4090, .dst = 0 },     /* source across two pages */
			{ .kind = FM_EDIT_GET, .len = 8, .src = 8 * 4096 },             /* outside the space */
			{ .kind = FM_EDIT_MOVE, .len = 8, .src = 0, .dst = 8 * 4096 - 4 }, /* destination leaves it */
			{ .kind = FM_EDIT_MOVE, .reserved = 1, .len = 8, .src = 0, .dst = 8 },
		};
		uint64_t junk = 0;
		for (unsigned k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
			expect_edit_error(&a, sa, &bad[k], 1, NULL, 0, FM_E_RANGE, "a bad entry");
		/* PUT bytes that do not add up */
		struct fm_edit_ent put = { .kind = FM_EDIT_PUT, .len = 8, .dst = 16 };
		expect_edit_error(&a, sa, &put, 1, &junk, 4, FM_E_RANGE, "too few PUT bytes");
		struct fm_edit_ent put2[2] = { { .kind = FM_EDIT_PUT, .len = 8, .dst = 16 },
					       { .kind = FM_EDIT_GET, .len = 8, .src = 5 * 4096 } };
		/* a page memd does not hold, read: nothing happens, not even the PUT before it */
		expect_edit_error(&a, sa, put2, 2, &junk, 8, FM_E_ABSENT, "a read of an absent page");
		expect_edit_error(&a, sa + 100, &put, 1, &junk, 8, FM_E_NOSPACE, "no such space");
	}
	{
		/* Four pages of quota, three used: two new pages are one too many (and nothing changes). */
		uint64_t one = 1;
		struct fm_edit_ent e[2] = { { .kind = FM_EDIT_PUT, .len = 8, .dst = 4 * 4096 },
					    { .kind = FM_EDIT_PUT, .len = 8, .dst = 5 * 4096 } };
		uint64_t two[2] = { 1, 2 };
		expect_edit_error(&a, sa, e, 2, two, 16, FM_E_FULL, "full");
		(void)one;
	}
	{
		struct fm_stats after = stats(&a);
		CHECK(after.writes == before.writes && st.used == 3, "refused edits changed nothing");
	}
	{
		/* A page damaged in memd's memory (flipped through the store, mapped) is never built on. */
		struct fm_space_ref ref = { sa, 0 };
		struct fm_shm_map_rep mr;
		struct fm_edit_ent e = { .kind = FM_EDIT_MOVE, .len = 8, .src = 0, .dst = 4096 + 8 };
		struct rep r = expect_ok(&a, FM_OP_SHM_MAP, 0, &ref, sizeof(ref));
		uint8_t *map;
		memcpy(&mr, r.payload, sizeof(mr));
		map = mmap(NULL, mr.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
		CHECK(map != MAP_FAILED, "mmap");
		map[100] ^= 0xff;
		expect_edit_error(&a, sa, &e, 1, NULL, 0, FM_E_CRC, "a damaged page");
		map[100] ^= 0xff;
		munmap(map, mr.map_len);
		rep_free(&r);
	}
	for (unsigned k = 0; k < 3; k++) {
		struct rep r;
		uint8_t pl[16];
		struct fm_space_ref ref = { sa, 0 };
		memcpy(pl, &ref, 8);
		memcpy(pl + 8, &all[k], 8);
		r = expect_ok(&a, FM_OP_READ, 1, pl, 16);
		CHECK(memcmp(r.payload + 8, want[k], FM_PAGE_SIZE) == 0, "page %u unchanged by the refused edits", k);
		rep_free(&r);
	}
	drop_queue(&a);
	memd_conn_fini(&a);
	memd_store_fini(&st);
}

static void test_pipelining_and_partial(struct memd_store *st)
{
	struct memd_conn c;
	uint8_t buf[4 * sizeof(struct fm_hdr)];
	struct rep r;

	conn_open(&c, st, false);
	new_session(&c);
	/* Three requests in one feed, replies in order with their ids. */
	for (int i = 0; i < 4; i++) {
		struct fm_hdr h = { FM_PROTO_MAGIC, i == 2 ? 55 : FM_OP_STATS, 0, 1000 + i, 0, 0 };

		memcpy(buf + i * sizeof(h), &h, sizeof(h));
	}
	CHECK(memd_conn_feed(&c, buf, sizeof(buf)) == 0, "feed");
	CHECK(memd_conn_process(&c) == 0, "process");
	for (int i = 0; i < 4; i++) {
		CHECK(take_reply(&c, &r), "reply %d", i);
		CHECK(r.h.req_id == (uint64_t)(1000 + i), "order: %llu at %d",
		      (unsigned long long)r.h.req_id, i);
		CHECK(i == 2 ? r.h.op == FM_OP_ERROR : r.h.op == FM_OP_STATS, "op at %d", i);
		rep_free(&r);
	}
	/* A frame fed byte by byte runs only when complete. */
	{
		struct fm_hdr h = { FM_PROTO_MAGIC, FM_OP_QUOTA, 0, 77, 0, 8 };
		int64_t d = 0;
		uint8_t f[sizeof(h) + 8];

		memcpy(f, &h, sizeof(h));
		memcpy(f + sizeof(h), &d, 8);
		for (size_t i = 0; i < sizeof(f); i++) {
			CHECK(!take_reply(&c, &r), "early reply at byte %zu", i);
			CHECK(memd_conn_feed(&c, f + i, 1) == 0, "feed");
			CHECK(memd_conn_process(&c) == 0, "process");
		}
		CHECK(take_reply(&c, &r) && r.h.req_id == 77 && r.h.op == FM_OP_QUOTA, "partial");
		rep_free(&r);
	}
	/* Bad magic after good frames: the good ones are answered, then close. */
	{
		struct fm_hdr h[2] = { { FM_PROTO_MAGIC, FM_OP_STATS, 0, 1, 0, 0 },
				       { 0x12345678, FM_OP_STATS, 0, 2, 0, 0 } };

		CHECK(memd_conn_feed(&c, h, sizeof(h)) == 0, "feed");
		CHECK(memd_conn_process(&c) == 0, "process");
		CHECK(take_reply(&c, &r) && r.h.op == FM_OP_STATS, "first answered");
		rep_free(&r);
		CHECK(take_reply(&c, &r) && r.h.op == FM_OP_ERROR && r.h.status == FM_E_PROTO,
		      "bad magic");
		rep_free(&r);
		CHECK(c.closing && memd_conn_done(&c), "closing");
	}
	memd_conn_fini(&c);
}

static uint32_t rnd32(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 16);
}

/* Random frames into authenticated and fresh connections: no crash, no leak, bounded. */
static void test_fuzz(struct memd_store *st)
{
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	static uint8_t pl[FM_MAX_PAYLOAD];
	struct memd_conn c;
	int frames = 0, reconnects = 0;

	conn_open(&c, st, true);
	new_session(&c);
	space_open(&c, 64);
	for (int it = 0; it < 20000; it++) {
		struct fm_hdr h;
		uint32_t kind = rnd32(&seed) % 16;
		const uint16_t ops[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 13, 14, 14, 15, 0x7fff };

		h.magic = kind == 0 ? rnd32(&seed) : FM_PROTO_MAGIC;
		h.op = ops[rnd32(&seed) % (sizeof(ops) / sizeof(ops[0]))];
		h.status = (uint16_t)rnd32(&seed);
		h.req_id = it;
		h.count = kind < 3 ? rnd32(&seed) : rnd32(&seed) % 300;
		/* Mostly consistent lengths, so that the ops themselves run. */
		switch (h.op) {
		case FM_OP_READ: h.len = 8 + 8 * h.count; break;
		case FM_OP_WRITE: h.len = 8 + 4112 * (h.count % 4); h.count %= 4; break;
		case FM_OP_DISCARD: h.len = 8 + 16 * h.count; break;
		/* Space ids and pages come out small (below): own, foreign and closed spaces, pages in and out of range. */
		case FM_OP_COPY: h.len = 8 + 16 * h.count; break;
		case FM_OP_SPACE_OPEN: h.len = 16; h.count = 0; break;
		case FM_OP_QUOTA: case FM_OP_SPACE_CLOSE: case FM_OP_SHM_MAP:
			h.len = 8; h.count = 0; break;
		case FM_OP_SESSION_JOIN: h.len = 24; h.count = 0; break;
		case FM_OP_SESSION_NEW: case FM_OP_STATS: h.len = 0; h.count = 0; break;
		default: h.len = rnd32(&seed) % 64; break;
		}
		if (kind == 2)
			h.len = rnd32(&seed) % 64;
		if (kind == 1)
			h.len = rnd32(&seed);
		if (h.len > FM_MAX_PAYLOAD)
			h.len = kind == 1 ? h.len : FM_MAX_PAYLOAD;
		for (uint32_t i = 0; h.len <= FM_MAX_PAYLOAD && i < h.len; i += 4) {
			uint32_t v = rnd32(&seed);

			/* Small numbers make space ids, pages and counts that exist. */
			if (rnd32(&seed) % 2)
				v %= 70;
			memcpy(pl + i, &v, (h.len - i) < 4 ? h.len - i : 4);
		}
		CHECK(memd_conn_feed(&c, &h, sizeof(h)) == 0, "feed");
		if (h.len <= FM_MAX_PAYLOAD)
			CHECK(memd_conn_feed(&c, pl, h.len) == 0, "feed");
		CHECK(memd_conn_process(&c) == 0, "process");
		drop_queue(&c);
		frames++;
		if (c.closing) {
			memd_conn_fini(&c);
			reconnects++;
			conn_open(&c, st, rnd32(&seed) % 2);
			if (rnd32(&seed) % 4)
				new_session(&c);
		}
	}
	memd_conn_fini(&c);
	CHECK(st->nsessions == 0 && st->used == 0 && st->va_used == 0, "fuzz left state: "
	      "%llu sessions %llu used", (unsigned long long)st->nsessions,
	      (unsigned long long)st->used);
	CHECK(reconnects > 10, "fuzz never closed a connection (%d)", reconnects);
	printf("fuzz: %d frames, %d reconnects\n", frames, reconnects);

	/* Raw garbage before the handshake. */
	for (int it = 0; it < 2000; it++) {
		uint8_t g[97];

		for (size_t i = 0; i < sizeof(g); i++)
			g[i] = (uint8_t)rnd32(&seed);
		memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, false);
		CHECK(memd_conn_feed(&c, g, (size_t)(rnd32(&seed) % sizeof(g))) == 0, "feed");
		CHECK(memd_conn_process(&c) == 0, "process");
		CHECK(c.state != MEMD_C_READY, "garbage authenticated");
		drop_queue(&c);
		memd_conn_fini(&c);
	}
}

/* Real I/O: fd passing and back-pressure over a socketpair. */
static void test_socket(struct memd_store *st)
{
	int sv[2];
	struct memd_conn c;
	struct fm_hdr h;
	uint32_t sp;
	int reads = 0;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	memd_conn_init(&c, st, SECRET, strlen(SECRET), -1, true);
	handshake(&c);
	new_session(&c);
	sp = space_open(&c, 300);
	c.fd = sv[0];

	/* A STATS then an SHM_MAP: the fd must arrive with the second header. */
	{
		struct { struct fm_hdr a; struct fm_hdr b; struct fm_space_ref r; }
			__attribute__((packed)) q = {
			{ FM_PROTO_MAGIC, FM_OP_STATS, 0, 1, 0, 0 },
			{ FM_PROTO_MAGIC, FM_OP_SHM_MAP, 0, 2, 0, 8 }, { sp, 0 } };
		uint8_t buf[sizeof(struct fm_stats)];
		union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } cm;
		struct iovec iov = { &h, sizeof(h) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				     .msg_controllen = sizeof(cm.b) };
		struct cmsghdr *ch;
		int fd = -1;

		CHECK(write(sv[1], &q, sizeof(q)) == sizeof(q), "write");
		CHECK(memd_conn_service(&c, true) == 0, "service");
		CHECK(read(sv[1], &h, sizeof(h)) == sizeof(h) && h.op == FM_OP_STATS, "stats hdr");
		CHECK(read(sv[1], buf, sizeof(buf)) == sizeof(buf), "stats body");
		CHECK(recvmsg(sv[1], &mh, 0) == sizeof(h) && h.op == FM_OP_SHM_MAP, "shm hdr");
		ch = CMSG_FIRSTHDR(&mh);
		CHECK(ch && ch->cmsg_type == SCM_RIGHTS, "fd with the SHM_MAP header");
		memcpy(&fd, CMSG_DATA(ch), sizeof(int));
		CHECK(fcntl(fd, F_GETFD) >= 0, "fd valid");
		close(fd);
		CHECK(read(sv[1], buf, h.len) == (ssize_t)h.len, "shm body");
	}

	/* Pipelined READs that are never read: memd stops reading at the high mark. */
	{
		uint8_t q[sizeof(struct fm_hdr) + 8 + 256 * 8];
		struct fm_hdr rh = { FM_PROTO_MAGIC, FM_OP_READ, 0, 0, 256,
				     8 + 256 * 8 };
		struct fm_space_ref ref = { sp, 0 };

		memset(q, 0, sizeof(q));
		memcpy(q + sizeof(rh), &ref, sizeof(ref));
		fcntl(sv[1], F_SETFL, O_NONBLOCK);
		for (int i = 0; i < 20; i++) {
			rh.req_id = 100 + i;
			memcpy(q, &rh, sizeof(rh));
			if (write(sv[1], q, sizeof(q)) != sizeof(q))
				break;
		}
		for (int i = 0; i < 10; i++)
			CHECK(memd_conn_service(&c, true) == 0, "service");
		CHECK(c.tx_bytes >= MEMD_TX_HIGH && !memd_conn_wants_read(&c),
		      "back-pressure: %zu queued", c.tx_bytes);
		CHECK(c.tx_bytes < MEMD_TX_HIGH + 2 * (8 + 256 * (8 + FM_PAGE_SIZE)),
		      "bounded queue: %zu", c.tx_bytes);
		/* Drain: every reply arrives, in order. */
		for (int spins = 0; spins < 100000 && reads < 20; spins++) {
			static uint8_t body[256 * (8 + FM_PAGE_SIZE)];
			ssize_t n;

			CHECK(memd_conn_service(&c, true) == 0, "service");
			n = recv(sv[1], &h, sizeof(h), MSG_PEEK);
			if (n != sizeof(h))
				continue;
			if (recv(sv[1], &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT) == sizeof(h)) {
				size_t got = 0;

				CHECK(recv(sv[1], &h, sizeof(h), 0) == sizeof(h), "hdr");
				CHECK(h.req_id == (uint64_t)(100 + reads) && h.op == FM_OP_READ,
				      "drain order %llu", (unsigned long long)h.req_id);
				while (got < h.len) {
					n = recv(sv[1], body + got, h.len - got, 0);
					if (n > 0)
						got += (size_t)n;
					else
						CHECK(memd_conn_service(&c, true) == 0, "service");
				}
				reads++;
			}
		}
		CHECK(reads == 20, "drained %d of 20 replies", reads);
	}
	close(sv[1]);
	CHECK(memd_conn_service(&c, true) == 0 && memd_conn_done(&c), "peer gone: done");
	memd_conn_fini(&c);
}

int main(void)
{
	struct memd_store st;

	fm_log_prefix = "test_protocol";
	fm_log_level = FM_LOG_ERROR;
	CHECK(fm_crc32c("123456789", 9) == 0xe3069283u, "crc32c");
	CHECK(memd_store_init(&st, 1 << 20, 1 << 20) == 0, "init");
	test_frame_check();
	test_handshake(&st);
	test_pages(&st);
	test_capacity_and_isolation();
	test_shm();
	test_shm_alloc();
	test_copy();
	test_edit();
	test_pipelining_and_partial(&st);
	test_socket(&st);
	test_fuzz(&st);
	CHECK(st.connections == 0, "connections %llu", (unsigned long long)st.connections);
	memd_store_fini(&st);
	printf("test_protocol: %d checks passed\n", checks);
	return 0;
}
