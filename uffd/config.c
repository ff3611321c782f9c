// SPDX-License-Identifier: Apache-2.0
/* Pager knobs: the list in knobs.h, parsed from FARMEM_* variables or from agent options. */
#include "pager.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fm_util.h"
#include "knobs.h"
#include "transport.h"

/* ENUM knobs are kept as the index of their choice: these enums are those indexes. */
_Static_assert(FM_PREF_AUTO == 0 && FM_PREF_STREAM == 1 && FM_PREF_SHM == 2, "transport=auto|stream|shm");
_Static_assert(FM_FAULT_AUTO == 0 && FM_FAULT_SIGNAL == 1 && FM_FAULT_THREAD == 2, "fault=auto|signal|thread");
_Static_assert(FM_LOG_ERROR == 0 && FM_LOG_WARN == 1 && FM_LOG_INFO == 2 && FM_LOG_DEBUG == 3,
	       "log=error|warn|info|debug");

#define CFG_FIELD(f) (((struct fm_pager_cfg *)0)->f)

#define CFG(f) sizeof(CFG_FIELD(f))
#define AGENT(f) 0
#define CLI 0
FM_KNOBS(FM_KNOB_SIZE_CHECK)
#undef CFG
#undef AGENT
#undef CLI

#define CFG(f) FM_KW_CFG, offsetof(struct fm_pager_cfg, f), sizeof(CFG_FIELD(f))
#define AGENT(f) FM_KW_AGENT, 0, 0
#define CLI FM_KW_CLI, 0, 0
const struct fm_knob fm_knobs[] = { FM_KNOBS(FM_KNOB_ENTRY) };
const size_t fm_nknobs = sizeof(fm_knobs) / sizeof(fm_knobs[0]);

const struct fm_knob *fm_knob_find(const char *name)
{
	for (size_t i = 0; i < fm_nknobs; i++)
		if (!strcasecmp(fm_knobs[i].name, name))
			return &fm_knobs[i];
	return NULL;
}

/* The index of val among "a|b|c", or -1. */
static int choice_index(const char *choices, const char *val)
{
	size_t n = strlen(val);
	int i = 0;

	for (const char *c = choices; *c; i++) {
		size_t len = strcspn(c, "|");
		if (len == n && !strncasecmp(c, val, n))
			return i;
		c += len + (c[len] == '|');
	}
	return -1;
}

static int set_string(const struct fm_knob *k, const char *val, char *dst, char *err, size_t errlen)
{
	size_t n = strlen(val);

	if ((k->type != FM_KT_STR && !n) || n >= k->size) {
		snprintf(err, errlen, "%s=%s: expected %s of at most %zu bytes", k->name, val,
			 k->type == FM_KT_PATH ? "a file name" : k->type == FM_KT_ADDRS ? "memd addresses" : "a string",
			 k->size - 1);
		return -EINVAL;
	}
	memcpy(dst, val, n + 1);
	/* ',' separates agent options, so an option lists memds with ';'; the pager wants ','. */
	if (k->type == FM_KT_ADDRS)
		for (char *c = dst; *c; c++)
			if (*c == ';')
				*c = ',';
	return 0;
}

int fm_knob_parse(const struct fm_knob *k, const char *val, void *base, char *err, size_t errlen)
{
	char *field = (char *)base + k->off;
	uint64_t v;
	unsigned u;
	int i;

	switch (k->type) {
	case FM_KT_UINT:
	case FM_KT_PCT:
	case FM_KT_BOOL: {
		char num[32];
		size_t n = strlen(val);
		if (k->type == FM_KT_PCT && n > 1 && n < sizeof(num) && val[n - 1] == '%') {
			memcpy(num, val, n - 1);
			num[n - 1] = '\0';
			val = num;
		}
		if (fm_parse_u64(val, k->min, k->max, &v)) {
			if (k->type == FM_KT_BOOL)
				snprintf(err, errlen, "%s=%s: expected 1 or 0", k->name, val);
			else
				snprintf(err, errlen, "%s=%s: expected a whole number from %llu to %llu", k->name,
					 val, (unsigned long long)k->min, (unsigned long long)k->max);
			return -EINVAL;
		}
		u = (unsigned)v;
		memcpy(field, &u, sizeof(u));
		return 0;
	}
	case FM_KT_SIZE:
		if (fm_parse_bytes(val, &v) || v < k->min) {
			snprintf(err, errlen, "%s=%s: expected a size of at least %llu bytes (e.g. 64M)", k->name, val,
				 (unsigned long long)k->min);
			return -EINVAL;
		}
		memcpy(field, &v, sizeof(v));
		return 0;
	case FM_KT_ENUM:
		if ((i = choice_index(k->choices, val)) < 0) {
			snprintf(err, errlen, "%s=%s: expected one of %s", k->name, val, k->choices);
			return -EINVAL;
		}
		memcpy(field, &i, sizeof(i));
		return 0;
	case FM_KT_STR:
	case FM_KT_ADDRS:
	case FM_KT_PATH:
		return set_string(k, val, field, err, errlen);
	default:
		snprintf(err, errlen, "%s: this knob's type is not parsed here", k->name);
		return -EINVAL;
	}
}

/* LOCAL: bytes of at least min, or a percentage, into local_bytes or local_pct. */
static int set_local(struct fm_pager_cfg *cfg, const struct fm_knob *k, const char *val, char *err, size_t errlen)
{
	size_t n = strlen(val);
	uint64_t v;

	if (n > 1 && val[n - 1] == '%') {
		char num[32];
		if (n - 1 >= sizeof(num) || (memcpy(num, val, n - 1), num[n - 1] = '\0', fm_parse_u64(num, 1, 100, &v))) {
			snprintf(err, errlen, "%s=%s: a percentage must be from 1%% to 100%%", k->name, val);
			return -EINVAL;
		}
		cfg->local_pct = (unsigned)v;
		cfg->local_bytes = 0;
		return 0;
	}
	if (fm_parse_bytes(val, &v) || v < k->min) {
		snprintf(err, errlen, "%s=%s: expected a size of at least 1M (e.g. 64M, 2G) or a percentage (25%%)",
			 k->name, val);
		return -EINVAL;
	}
	cfg->local_bytes = v;
	cfg->local_pct = 0;
	return 0;
}

int fm_pager_cfg_set(struct fm_pager_cfg *cfg, const char *key, const char *val, char *err, size_t errlen)
{
	const struct fm_knob *k = fm_knob_find(key);

	if (!k || k->where != FM_KW_CFG) {
		snprintf(err, errlen, "unknown option '%s'", key);
		return -ENOENT;
	}
	if (k->type == FM_KT_LOCAL)
		return set_local(cfg, k, val, err, errlen);
	if (k->type == FM_KT_SECRET) {
		size_t n = strlen(val);
		if (!n || n >= sizeof(cfg->secret)) {
			snprintf(err, errlen, "%s: expected 1 to %zu bytes", k->name, sizeof(cfg->secret) - 1);
			return -EINVAL;
		}
		memcpy(cfg->secret, val, n);
		cfg->secret_len = n;
		return 0;
	}
	return fm_knob_parse(k, val, cfg, err, errlen);
}

void fm_pager_cfg_defaults(struct fm_pager_cfg *cfg)
{
	char err[256];

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < fm_nknobs; i++)
		if (fm_knobs[i].where == FM_KW_CFG && fm_knobs[i].def[0] &&
		    fm_pager_cfg_set(cfg, fm_knobs[i].name, fm_knobs[i].def, err, sizeof(err)))
			abort(); /* a default the parser refuses: tests/unit/test_core.c catches it first */
}

int fm_pager_cfg_env(struct fm_pager_cfg *cfg, unsigned scope, char *err, size_t errlen)
{
	for (size_t i = 0; i < fm_nknobs; i++) {
		const struct fm_knob *k = &fm_knobs[i];
		const char *v;
		if (k->where != FM_KW_CFG || !k->env || (scope && !(k->scope & scope)))
			continue;
		v = getenv(k->env);
		if (v && fm_pager_cfg_set(cfg, k->name, v, err, errlen)) {
			/* Name the variable, not the bare key, in the message. */
			char msg[512];
			snprintf(msg, sizeof(msg), "%s: %s", k->env, err);
			snprintf(err, errlen, "%s", msg);
			return -EINVAL;
		}
	}
	return 0;
}

int fm_pager_cfg_from_env(struct fm_pager_cfg *cfg, char *err, size_t errlen)
{
	int rc;

	fm_pager_cfg_defaults(cfg);
	if ((rc = fm_pager_cfg_env(cfg, 0, err, errlen)))
		return rc;
	if (cfg->evict_low >= cfg->evict_high) {
		snprintf(err, errlen, "FARMEM_EVICT_LOW (%u) must be below FARMEM_EVICT_HIGH (%u)",
			 cfg->evict_low, cfg->evict_high);
		return -EINVAL;
	}
	return 0;
}
