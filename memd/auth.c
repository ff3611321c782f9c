// SPDX-License-Identifier: Apache-2.0
#include "auth.h"

#include <string.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

static void mac3(const void *secret, size_t secret_len, const char *label,
		 const uint8_t a[FM_NONCE_LEN], const uint8_t b[FM_NONCE_LEN],
		 uint8_t out[FM_MAC_LEN])
{
	uint8_t msg[16 + 2 * FM_NONCE_LEN];
	unsigned int outlen = FM_MAC_LEN;

	memcpy(msg, label, 16);
	memcpy(msg + 16, a, FM_NONCE_LEN);
	memcpy(msg + 16 + FM_NONCE_LEN, b, FM_NONCE_LEN);
	HMAC(EVP_sha256(), secret, (int)secret_len, msg, sizeof(msg), out, &outlen);
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

int fm_auth_mac_equal(const uint8_t a[FM_MAC_LEN], const uint8_t b[FM_MAC_LEN])
{
	return CRYPTO_memcmp(a, b, FM_MAC_LEN) == 0;
}
