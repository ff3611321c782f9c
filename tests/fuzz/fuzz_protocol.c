// SPDX-License-Identifier: Apache-2.0
/*
 * libFuzzer harness for memd's protocol engine (memd/server/conn.c): frame
 * checks, the handshake and every op, driven on byte buffers as the unit test
 * does (tests/unit/test_protocol.c). Built with -fsanitize=fuzzer,address,undefined
 * by `make fuzz`; seed corpus in tests/fuzz/corpus/ (tests/fuzz/make_corpus.py).
 *
 * Input: one flags byte, then the bytes a client sends.
 *   bit 0: run a correct HELLO/AUTH and SESSION_NEW + SPACE_OPEN(16 pages) first,
 *          so that the fuzzed bytes reach the ops behind authentication
 *   bit 1: the connection is a Unix socket (SHM_MAP allowed)
 *   bits 2-4: feed the bytes in chunks of 2^k * 7 bytes (0 = all at once)
 * Also: the first 24 bytes go through memd_frame_check in every state.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "fm_util.h"
#include "protocol.h"
#include "server.h"

static const char SECRET[] = "fuzz-secret";
static struct memd_store store;

static void drain(struct memd_conn *c, uint8_t *last, size_t *last_len)
{
	struct memd_txbuf *t;
	while ((t = c->tx_head)) {
		size_t n = t->len - t->off;
		if (last && n <= 4096) {
			memcpy(last, t->data + t->off, n);
			*last_len = n;
		}
		if (t->fd >= 0)
			close(t->fd);
		c->tx_head = t->next;
		free(t);
	}
	c->tx_tail = NULL;
	c->tx_bytes = 0;
}

static void run(struct memd_conn *c, const void *buf, size_t len, uint8_t *last, size_t *last_len)
{
	if (len && memd_conn_feed(c, buf, len))
		return;
	for (int k = 0; k < 256; k++) {
		size_t before = c->rx_len - c->rx_off;
		if (memd_conn_process(c))
			return;
		drain(c, last, last_len);
		if (c->closing || c->rx_len - c->rx_off == before)
			break;
	}
}

static void frame(struct memd_conn *c, uint16_t op, const void *pl, uint32_t len, uint8_t *rep, size_t *rl)
{
	struct fm_hdr h = { FM_PROTO_MAGIC, op, 0, 1, 0, len };
	uint8_t b[sizeof(h) + 256];
	memcpy(b, &h, sizeof(h));
	if (len)
		memcpy(b + sizeof(h), pl, len);
	*rl = 0;
	run(c, b, sizeof(h) + len, rep, rl);
}

/* A correct handshake, a session and one space: the fuzzed bytes then reach every op. */
static bool prelude(struct memd_conn *c)
{
	struct fm_hello_req hr = { 1, 1, 0, { 0 } };
	struct fm_hello_rep hp;
	struct fm_auth_req ar;
	struct fm_space_open_req so = { .npages = 16 };
	uint8_t rep[4096];
	size_t rl;

	memset(hr.client_nonce, 7, sizeof(hr.client_nonce));
	frame(c, FM_OP_HELLO, &hr, sizeof(hr), rep, &rl);
	if (rl != sizeof(struct fm_hdr) + sizeof(hp))
		return false;
	memcpy(&hp, rep + sizeof(struct fm_hdr), sizeof(hp));
	fm_auth_client_mac(SECRET, strlen(SECRET), hp.server_nonce, hr.client_nonce, ar.mac);
	frame(c, FM_OP_AUTH, &ar, sizeof(ar), rep, &rl);
	frame(c, FM_OP_SESSION_NEW, NULL, 0, rep, &rl);
	frame(c, FM_OP_SPACE_OPEN, &so, sizeof(so), rep, &rl);
	return c->state == MEMD_C_READY && c->sess;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fm_log_level = -1; /* quiet: memd logs every bad frame */
	return memd_store_init(&store, 256, 128);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct memd_conn c;
	uint8_t flags;
	size_t chunk;

	if (size < 1)
		return 0;
	flags = data[0];
	data++;
	size--;
	if (size >= sizeof(struct fm_hdr)) {
		struct memd_hdr h;
		uint16_t st;
		char msg[128];
		for (int state = MEMD_C_HELLO; state <= MEMD_C_READY; state++)
			(void)memd_frame_check(data, state, &h, &st, msg, sizeof(msg));
	}
	memd_conn_init(&c, &store, SECRET, strlen(SECRET), -1, flags & 2);
	if ((flags & 1) && !prelude(&c))
		__builtin_trap(); /* the real handshake must work */
	chunk = (flags >> 2) & 7 ? ((size_t)7 << ((flags >> 2) & 7)) : size;
	for (size_t off = 0; off < size && !c.closing; off += chunk)
		run(&c, data + off, size - off < chunk ? size - off : chunk, NULL, NULL);
	drain(&c, NULL, NULL);
	memd_conn_fini(&c);
	return 0;
}
