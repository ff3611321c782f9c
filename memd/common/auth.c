// SPDX-License-Identifier: Apache-2.0
#include "auth.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

/*
 * libcrypto is opened on first use, not linked: the preload shim goes into
 * every process `farmem run` starts, and most of them never talk to memd,
 * while loading and relocating libcrypto costs every exec about half a
 * millisecond.
 *
 * HMAC is built here from SHA-256's init/update/final on a context on the
 * stack, not with libcrypto's HMAC(): that one allocates and takes the
 * provider store's locks, and a client may have to authenticate a new
 * connection inside a signal handler (a transport's data path, see
 * transport.h), where neither is allowed.
 */
static struct {
	__typeof__(SHA256_Init) *init;
	__typeof__(SHA256_Update) *update;
	__typeof__(SHA256_Final) *final;
	char err[200];
} crypto;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;
static atomic_int crypto_ready;

static void crypto_open(void)
{
	void *h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);

	if (h) {
		crypto.init = (__typeof__(SHA256_Init) *)dlsym(h, "SHA256_Init");
		crypto.update = (__typeof__(SHA256_Update) *)dlsym(h, "SHA256_Update");
		crypto.final = (__typeof__(SHA256_Final) *)dlsym(h, "SHA256_Final");
	}
	if (!crypto.init || !crypto.update || !crypto.final) {
		const char *why = dlerror();
		snprintf(crypto.err, sizeof(crypto.err), "cannot load SHA-256 from libcrypto.so.3 "
			 "(memd authentication; Debian: libssl3): %s", why ? why : "symbol missing");
		return;
	}
	atomic_store(&crypto_ready, 1);
}

int fm_auth_init(char *err, size_t errlen)
{
	if (atomic_load(&crypto_ready))
		return 0;
	pthread_once(&crypto_once, crypto_open);
	if (atomic_load(&crypto_ready))
		return 0;
	if (err && errlen)
		snprintf(err, errlen, "%s", crypto.err);
	return -1;
}

/* RFC 2104 over SHA-256 (block 64 bytes). */
int fm_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
		   uint8_t out[FM_MAC_LEN])
{
	uint8_t k[64] = { 0 }, pad[64], inner[32];
	SHA256_CTX c;

	/* After the first call (at connect) this is one atomic load: signal-safe. */
	if (fm_auth_init(NULL, 0))
		return -1;
	if (key_len > sizeof(k)) {
		crypto.init(&c);
		crypto.update(&c, key, key_len);
		crypto.final(k, &c);
	} else {
		memcpy(k, key, key_len);
	}
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k[i] ^ 0x36;
	crypto.init(&c);
	crypto.update(&c, pad, sizeof(pad));
	crypto.update(&c, msg, msg_len);
	crypto.final(inner, &c);
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k[i] ^ 0x5c;
	crypto.init(&c);
	crypto.update(&c, pad, sizeof(pad));
	crypto.update(&c, inner, sizeof(inner));
	crypto.final(out, &c);
	explicit_bzero(k, sizeof(k));
	explicit_bzero(pad, sizeof(pad));
	explicit_bzero(inner, sizeof(inner));
	explicit_bzero(&c, sizeof(c));
	return 0;
}

static void mac3(const void *secret, size_t secret_len, const char *label,
		 const uint8_t a[FM_NONCE_LEN], const uint8_t b[FM_NONCE_LEN],
		 uint8_t out[FM_MAC_LEN])
{
	uint8_t msg[16 + 2 * FM_NONCE_LEN];

	memcpy(msg, label, 16);
	memcpy(msg + 16, a, FM_NONCE_LEN);
	memcpy(msg + 16 + FM_NONCE_LEN, b, FM_NONCE_LEN);
	/* Without libcrypto (fm_auth_init said why) no MAC matches: all zeros never verifies. */
	if (fm_hmac_sha256(secret, secret_len, msg, sizeof(msg), out))
		memset(out, 0, FM_MAC_LEN);
}

void fm_auth_client_mac(const void *secret, size_t secret_len,
			const uint8_t server_nonce[FM_NONCE_LEN],
			const uint8_t client_nonce[FM_NONCE_LEN], uint8_t mac[FM_MAC_LEN])
{
	mac3(secret, secret_len, "farmem-client-v1", server_nonce, client_nonce, mac);
}

void fm_auth_server_mac(const void *secret, size_t secret_len,
			const uint8_t server_nonce[FM_NONCE_LEN],
			const uint8_t client_nonce[FM_NONCE_LEN], uint8_t mac[FM_MAC_LEN])
{
	mac3(secret, secret_len, "farmem-server-v1", client_nonce, server_nonce, mac);
}

/* Constant time, like CRYPTO_memcmp: how much of a MAC matched must not show. */
int fm_auth_mac_equal(const uint8_t a[FM_MAC_LEN], const uint8_t b[FM_MAC_LEN])
{
	volatile uint8_t diff = 0;
	uint8_t zero = 0;

	for (size_t k = 0; k < FM_MAC_LEN; k++) {
		diff |= a[k] ^ b[k];
		zero |= a[k];
	}
	/* an all-zero MAC is what mac3 gives without libcrypto: it never verifies */
	return diff == 0 && zero != 0;
}
