// SPDX-License-Identifier: Apache-2.0
/* The agent's options (options.h): uffd/knobs.h's list, read from FARMEM_* and then OPTIONS. */
#include "options.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "knobs.h"

#define OPTS_FIELD(f) (((struct fm_agent_opts *)0)->f)
#define CFG(f) 0
#define AGENT(f) sizeof(OPTS_FIELD(f))
#define CLI 0
FM_KNOBS(FM_KNOB_SIZE_CHECK)
#undef CFG
#undef AGENT
#undef CLI

#define CFG(f) FM_KW_CFG, 0, 0
#define AGENT(f) FM_KW_AGENT, offsetof(struct fm_agent_opts, f), sizeof(OPTS_FIELD(f))
#define CLI FM_KW_CLI, 0, 0
/* knobs.h's list again, with the agent's own knobs located in struct fm_agent_opts. */
static const struct fm_knob agent_knobs[] = { FM_KNOBS(FM_KNOB_ENTRY) };
#define NKNOBS (sizeof(agent_knobs) / sizeof(agent_knobs[0]))

static const struct fm_knob *find(const char *name)
{
	for (size_t i = 0; i < NKNOBS; i++)
		if (!strcasecmp(agent_knobs[i].name, name))
			return &agent_knobs[i];
	return NULL;
}

static int read_secret_file(struct fm_pager_cfg *cfg, const char *path, char *err, size_t errlen)
{
	char buf[sizeof(cfg->secret) + 1];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0) {
		snprintf(err, errlen, "secret_file=%s: %s", path, strerror(errno));
		return -EINVAL;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n <= 0 || (size_t)n >= sizeof(cfg->secret)) {
		snprintf(err, errlen, "secret_file=%s: empty, unreadable or longer than %zu bytes", path,
			 sizeof(cfg->secret) - 1);
		return -EINVAL;
	}
	buf[n] = '\0';
	return fm_pager_cfg_set(cfg, "secret", buf, err, errlen);
}

/* One key[=val] of OPTIONS. */
static int apply(struct fm_agent_opts *o, const char *key, const char *val, char *err, size_t errlen)
{
	const struct fm_knob *k = find(key);
	int rc;

	if (!k) {
		snprintf(err, errlen, "unknown option '%s' (docs/jvm.md lists them)", key);
		return -EINVAL;
	}
	if (!(k->scope & FM_KS_OPT)) {
		if (k->where == FM_KW_CLI)
			snprintf(err, errlen, "%s is a flag of farmem run (%s), not an agent option", k->name, k->flag);
		else
			snprintf(err, errlen, "%s is a knob of the preload shim (%s), not of the agent: the agent "
				 "pages the Java heap", k->name, k->env);
		return -EINVAL;
	}
	if (k->type == FM_KT_FLAG) {
		if (val) {
			snprintf(err, errlen, "%s takes no value (%s=%s)", k->name, k->name, val);
			return -EINVAL;
		}
		*(int *)((char *)o + k->off) = 1;
		return 0;
	}
	if (!val) {
		snprintf(err, errlen, "option '%s' needs a value (%s=...)", key, key);
		return -EINVAL;
	}
	if (k->where == FM_KW_CFG)
		return fm_pager_cfg_set(&o->cfg, k->name, val, err, errlen) ? -EINVAL : 0;
	if ((rc = fm_knob_parse(k, val, o, err, errlen)))
		return rc;
	if (!strcmp(k->name, "secret_file"))
		return read_secret_file(&o->cfg, o->secret_file, err, errlen);
	return 0;
}

int fm_agent_parse_options(const char *options, struct fm_agent_opts *o, char *err, size_t errlen)
{
	char *copy, *save = NULL, *tok;
	int rc = 0;

	memset(o, 0, sizeof(*o));
	fm_pager_cfg_defaults(&o->cfg);
	for (size_t i = 0; i < NKNOBS; i++)
		if (agent_knobs[i].where == FM_KW_AGENT && agent_knobs[i].def[0] &&
		    fm_knob_parse(&agent_knobs[i], agent_knobs[i].def, o, err, errlen))
			return -EINVAL;
	if ((rc = fm_pager_cfg_env(&o->cfg, FM_KS_OPT, err, errlen)))
		return rc;
	copy = strdup(options ? options : "");
	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
		char *val = strchr(tok, '=');
		if (val)
			*val++ = '\0';
		if (!*tok) {
			snprintf(err, errlen, "empty option name in '%s'", options);
			rc = -EINVAL;
		} else {
			rc = apply(o, tok, val, err, errlen);
		}
	}
	free(copy);
	if (rc)
		return rc;
	if (o->cfg.evict_low >= o->cfg.evict_high) {
		snprintf(err, errlen, "evict_low=%u must be below evict_high=%u", o->cfg.evict_low, o->cfg.evict_high);
		return -EINVAL;
	}
	o->local_pct = o->cfg.local_bytes ? 0 : o->cfg.local_pct;
	/* The agent registers the heap itself, whatever its size: the shim's threshold does not apply. */
	o->cfg.threshold = 4096;
	return 0;
}

int fm_agent_settle_budget(struct fm_agent_opts *o, uint64_t heap_bytes, char *err, size_t errlen)
{
	if (!heap_bytes)
		return 0; /* unknown: the pager takes the percentage of what is registered */
	if (o->local_pct) {
		o->cfg.local_bytes = heap_bytes * o->local_pct / 100;
		if (o->cfg.local_bytes < (1u << 20))
			o->cfg.local_bytes = 1u << 20;
		o->cfg.local_pct = 0;
	} else if (o->cfg.local_bytes > heap_bytes) {
		snprintf(err, errlen, "local=%llu MiB is larger than the Java heap (%llu MiB): nothing would "
			 "ever be remote", (unsigned long long)(o->cfg.local_bytes >> 20),
			 (unsigned long long)(heap_bytes >> 20));
		return -E2BIG;
	}
	return 0;
}
