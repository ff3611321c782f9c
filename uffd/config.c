// SPDX-License-Identifier: Apache-2.0
/* Pager knobs: one table, read from FARMEM_* variables or from agent options. */
#include "pager.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fm_util.h"
#include "transport.h"

void fm_pager_cfg_defaults(struct fm_pager_cfg *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->local_pct = 25;
	/*
	 * One handler: a second one on the other CPU adds a cross-CPU wakeup
	 * (an IPI, ~8 us under nested virtualisation) to every fault.
	 */
	cfg->fill_threads = 1;
	cfg->evict_high = 95;
	cfg->evict_low = 90;
	cfg->evict_batch = 64;
	cfg->fault_mode = 0;
	cfg->evict_threads = -1;
	cfg->prefetch = 8;
	cfg->epoch_pct = 5;
	cfg->threshold = 64ull << 20;
	cfg->xport_pref = FM_PREF_AUTO;
	cfg->gc_aware = 1;
	cfg->log_level = FM_LOG_WARN;
	cfg->replicas = 1;
	cfg->memd_copy = 1;
}

static int u(const char *key, const char *val, uint64_t min, uint64_t max, unsigned *out,
	     char *err, size_t errlen)
{
	uint64_t v;
	if (fm_parse_u64(val, min, max, &v)) {
		snprintf(err, errlen, "%s=%s: expected a whole number from %llu to %llu", key, val,
			 (unsigned long long)min, (unsigned long long)max);
		return -EINVAL;
	}
	*out = (unsigned)v;
	return 0;
}

int fm_pager_cfg_set(struct fm_pager_cfg *cfg, const char *key, const char *val, char *err, size_t errlen)
{
	if (!strcasecmp(key, "memd")) {
		if (!*val || strlen(val) >= sizeof(cfg->memd))
			goto bad;
		snprintf(cfg->memd, sizeof(cfg->memd), "%s", val);
	} else if (!strcasecmp(key, "secret")) {
		size_t n = strlen(val);
		if (!n || n >= sizeof(cfg->secret))
			goto bad;
		memcpy(cfg->secret, val, n);
		cfg->secret_len = n;
	} else if (!strcasecmp(key, "local")) {
		size_t n = strlen(val);
		if (n > 1 && val[n - 1] == '%') {
			char num[32];
			uint64_t pct;
			if (n - 1 >= sizeof(num))
				goto bad;
			memcpy(num, val, n - 1);
			num[n - 1] = '\0';
			if (fm_parse_u64(num, 1, 100, &pct)) {
				snprintf(err, errlen, "local=%s: a percentage must be from 1%% to 100%%", val);
				return -EINVAL;
			}
			cfg->local_pct = (unsigned)pct;
			cfg->local_bytes = 0;
		} else {
			if (fm_parse_bytes(val, &cfg->local_bytes) || cfg->local_bytes < (1u << 20)) {
				snprintf(err, errlen, "local=%s: expected a size of at least 1M (e.g. 64M, 2G) or a percentage (25%%)", val);
				return -EINVAL;
			}
			cfg->local_pct = 0;
		}
	} else if (!strcasecmp(key, "fill_threads")) {
		return u(key, val, 1, 16, &cfg->fill_threads, err, errlen);
	} else if (!strcasecmp(key, "evict_high")) {
		return u(key, val, 10, 100, &cfg->evict_high, err, errlen);
	} else if (!strcasecmp(key, "evict_low")) {
		return u(key, val, 5, 99, &cfg->evict_low, err, errlen);
	} else if (!strcasecmp(key, "evict_batch")) {
		return u(key, val, 1, 64, &cfg->evict_batch, err, errlen);
	} else if (!strcasecmp(key, "fault")) {
		if (!strcasecmp(val, "auto"))
			cfg->fault_mode = 0;
		else if (!strcasecmp(val, "signal"))
			cfg->fault_mode = 1;
		else if (!strcasecmp(val, "thread"))
			cfg->fault_mode = 2;
		else {
			snprintf(err, errlen, "fault=%s: expected auto, signal or thread", val);
			return -EINVAL;
		}
	} else if (!strcasecmp(key, "evict_threads")) {
		unsigned v;
		if (u(key, val, 0, 1, &v, err, errlen))
			return -EINVAL;
		cfg->evict_threads = (int)v;
	} else if (!strcasecmp(key, "prefetch")) {
		return u(key, val, 0, 64, &cfg->prefetch, err, errlen);
	} else if (!strcasecmp(key, "epoch_pct")) {
		return u(key, val, 1, 100, &cfg->epoch_pct, err, errlen);
	} else if (!strcasecmp(key, "gc_aware")) {
		unsigned v;
		if (u(key, val, 0, 1, &v, err, errlen))
			return -EINVAL;
		cfg->gc_aware = (int)v;
	} else if (!strcasecmp(key, "threshold")) {
		if (fm_parse_bytes(val, &cfg->threshold) || cfg->threshold < 4096)
			goto bad;
	} else if (!strcasecmp(key, "transport")) {
		if (!strcasecmp(val, "auto"))
			cfg->xport_pref = FM_PREF_AUTO;
		else if (!strcasecmp(val, "stream"))
			cfg->xport_pref = FM_PREF_STREAM;
		else if (!strcasecmp(val, "shm"))
			cfg->xport_pref = FM_PREF_SHM;
		else {
			snprintf(err, errlen, "transport=%s: expected auto, stream or shm", val);
			return -EINVAL;
		}
	} else if (!strcasecmp(key, "replicas")) {
		return u(key, val, 1, 8, &cfg->replicas, err, errlen);
	} else if (!strcasecmp(key, "memd_copy")) {
		return u(key, val, 0, 1, &cfg->memd_copy, err, errlen);
	} else if (!strcasecmp(key, "memd_timeout_ms")) {
		return u(key, val, 10, 600000, &cfg->memd_timeout_ms, err, errlen);
	} else if (!strcasecmp(key, "log")) {
		int l = fm_log_level_parse(val);
		if (l < 0) {
			snprintf(err, errlen, "log=%s: expected error, warn, info or debug", val);
			return -EINVAL;
		}
		cfg->log_level = l;
	} else if (!strcasecmp(key, "control")) {
		if (strlen(val) >= sizeof(cfg->control))
			goto bad;
		snprintf(cfg->control, sizeof(cfg->control), "%s", val);
	} else {
		snprintf(err, errlen, "unknown option '%s'", key);
		return -ENOENT;
	}
	return 0;
bad:
	snprintf(err, errlen, "%s=%s: bad value", key, val);
	return -EINVAL;
}

int fm_pager_cfg_from_env(struct fm_pager_cfg *cfg, char *err, size_t errlen)
{
	static const char *const keys[] = {
		"MEMD", "SECRET", "LOCAL", "FILL_THREADS", "EVICT_HIGH", "EVICT_LOW",
		"EVICT_BATCH", "PREFETCH", "EPOCH_PCT", "GC_AWARE", "THRESHOLD", "TRANSPORT",
		"LOG", "CONTROL", "REPLICAS", "MEMD_TIMEOUT_MS", "MEMD_COPY", "FAULT", "EVICT_THREADS",
	};
	char name[64];

	fm_pager_cfg_defaults(cfg);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		const char *v;
		snprintf(name, sizeof(name), "FARMEM_%s", keys[i]);
		v = getenv(name);
		if (v && fm_pager_cfg_set(cfg, keys[i], v, err, errlen)) {
			/* Name the variable, not the bare key, in the message. */
			char msg[512];
			snprintf(msg, sizeof(msg), "%s: %s", name, err);
			snprintf(err, errlen, "%s", msg);
			return -EINVAL;
		}
	}
	if (cfg->evict_low >= cfg->evict_high) {
		snprintf(err, errlen, "FARMEM_EVICT_LOW (%u) must be below FARMEM_EVICT_HIGH (%u)",
			 cfg->evict_low, cfg->evict_high);
		return -EINVAL;
	}
	return 0;
}
