/* SPDX-License-Identifier: Apache-2.0 */
/* The test programs' pattern: a 64-bit finaliser (MurmurHash3's), so that no two words repeat. */
#ifndef FARMEM_TESTS_MIX_H
#define FARMEM_TESTS_MIX_H

#include <stdint.h>

static inline uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

#endif
