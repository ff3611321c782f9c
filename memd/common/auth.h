/* SPDX-License-Identifier: Apache-2.0 */
/* Challenge and response over a shared secret (docs/protocol.md, "Authentication"). */
#ifndef FARMEM_AUTH_H
#define FARMEM_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include "protocol.h"

/*
 * Load SHA-256 (libcrypto, opened on first use): 0, or -1 with why in err.
 * Call it before the first MAC; after it, the MAC functions are
 * signal-safe (no allocation, no lock).
 */
int fm_auth_init(char *err, size_t errlen);

/* HMAC-SHA256 (RFC 2104). 0, or -1 when libcrypto cannot be loaded. */
int fm_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
		   uint8_t out[FM_MAC_LEN]);

/* HMAC-SHA256(secret, "farmem-client-v1" || server_nonce || client_nonce) */
void fm_auth_client_mac(const void *secret, size_t secret_len,
			const uint8_t server_nonce[FM_NONCE_LEN],
			const uint8_t client_nonce[FM_NONCE_LEN], uint8_t mac[FM_MAC_LEN]);
/* HMAC-SHA256(secret, "farmem-server-v1" || client_nonce || server_nonce) */
void fm_auth_server_mac(const void *secret, size_t secret_len,
			const uint8_t server_nonce[FM_NONCE_LEN],
			const uint8_t client_nonce[FM_NONCE_LEN], uint8_t mac[FM_MAC_LEN]);
/* Constant-time comparison of two MACs: 1 when equal. */
int fm_auth_mac_equal(const uint8_t a[FM_MAC_LEN], const uint8_t b[FM_MAC_LEN]);

#endif
