/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A size on a benchmark's or a test program's command line: 512M, 4KiB, 1g,
 * 65536. Shared by bench/progs and tests/progs so that each rejects what the
 * others reject (a sign, a size past 2^64, trailing words).
 */
#ifndef FARMEM_BENCH_SIZE_ARG_H
#define FARMEM_BENCH_SIZE_ARG_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

static inline int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -1;
	uint64_t mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1ULL << 10; end++; break;
	case 'm': case 'M': mul = 1ULL << 20; end++; break;
	case 'g': case 'G': mul = 1ULL << 30; end++; break;
	case 't': case 'T': mul = 1ULL << 40; end++; break;
	default: break;
	}
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

#endif
