// SPDX-License-Identifier: Apache-2.0
#include "auth.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

/*
 * libcrypto is opened on first use, not linked: the preload shim goes into
 * every process `farmem run` starts, and most of them never talk to memd,
 * while loading and relocating libcrypto costs every exec about half a
 * millisecond.
 */
static struct {
	__typeof__(HMAC) *hmac;
	__typeof__(EVP_sha256) *sha256;
	char err[200];
} crypto;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void crypto_open(void)
{
	void *h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);

	if (h) {
		crypto.hmac = (__typeof__(HMAC) *)dlsym(h, "HMAC");
		crypto.sha256 = (__typeof__(EVP_sha256) *)dlsym(h, "EVP_sha256");
	}
	if (!crypto.hmac || !crypto.sha256) {
		const char *why = dlerror();
		snprintf(crypto.err, sizeof(crypto.err), "cannot load HMAC-SHA256 from libcrypto.so.3 "
			 "(memd authentication; Debian: libssl3): %s", why ? why : "symbol missing");
		crypto.hmac = NULL;
	}
}

int fm_auth_init(char *err, size_t errlen)
{
	pthread_once(&crypto_once, crypto_open);
	if (crypto.hmac)
		return 0;
	if (err && errlen)
		snprintf(err, errlen, "%s", crypto.err);
	return -1;
}

static void mac3(const void *secret, size_t secret_len, const char *label,
		 const uint8_t a[FM_NONCE_LEN], const uint8_t b[FM_NONCE_LEN],
		 uint8_t out[FM_MAC_LEN])
{
	uint8_t msg[16 + 2 * FM_NONCE_LEN];
	unsigned int outlen = FM_MAC_LEN;

	memcpy(msg, label, 16);
	memcpy(msg + 16, a, FM_NONCE_LEN);
	memcpy(msg + 16 + FM_NONCE_LEN, b, FM_NONCE_LEN);
	/* Without libcrypto (fm_auth_init said why) no MAC matches: all zeros never verifies. */
	memset(out, 0, FM_MAC_LEN);
	if (fm_auth_init(NULL, 0) == 0)
		crypto.hmac(crypto.sha256(), secret, (int)secret_len, msg, sizeof(msg), out, &outlen);
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
