// SPDX-License-Identifier: Apache-2.0
/*
 * farmem-knobs: uffd/knobs.h as the compiler sees it, and what the real
 * parsers make of values. tools/gen_knobs.py writes the CLI's table and the
 * docs from `table`; tests/test_knobs.py holds every other consumer against
 * it through the other verbs. Prints JSON on stdout; a refused value exits 1
 * with the parser's message on stderr.
 *
 *   farmem-knobs table             the list
 *   farmem-knobs env               the pager's knobs from FARMEM_* (the preload shim's path)
 *   farmem-knobs agent [OPTIONS]   the agent's options parser, FARMEM_* included
 *   farmem-knobs set KEY VALUE     fm_pager_cfg_set on the defaults
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "knobs.h"
#include "options.h"
#include "pager.h"

#define OPTS_FIELD(f) (((struct fm_agent_opts *)0)->f)
#define CFG(f) FM_KW_CFG, offsetof(struct fm_agent_opts, cfg) + offsetof(struct fm_pager_cfg, f), \
	sizeof(((struct fm_pager_cfg *)0)->f)
#define AGENT(f) FM_KW_AGENT, offsetof(struct fm_agent_opts, f), sizeof(OPTS_FIELD(f))
#define CLI FM_KW_CLI, 0, 0
/* Every knob located in struct fm_agent_opts, whose cfg holds the pager's. */
static const struct fm_knob knobs[] = { FM_KNOBS(FM_KNOB_ENTRY) };
#define NKNOBS (sizeof(knobs) / sizeof(knobs[0]))

static const char *const type_names[] = {
	[FM_KT_UINT] = "uint", [FM_KT_PCT] = "pct", [FM_KT_BOOL] = "bool", [FM_KT_SIZE] = "size",
	[FM_KT_LOCAL] = "local", [FM_KT_ENUM] = "enum", [FM_KT_STR] = "str", [FM_KT_ADDRS] = "addrs",
	[FM_KT_SECRET] = "secret", [FM_KT_PATH] = "path", [FM_KT_FLAG] = "flag",
};
static const char *const where_names[] = { [FM_KW_CFG] = "cfg", [FM_KW_AGENT] = "agent", [FM_KW_CLI] = "cli" };

static void json_str(const char *s)
{
	if (!s) {
		fputs("null", stdout);
		return;
	}
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

static void table(void)
{
	puts("[");
	for (size_t i = 0; i < NKNOBS; i++) {
		const struct fm_knob *k = &knobs[i];
		const struct fm_knob *pk = fm_knob_find(k->name);
		printf(" {\"name\": ");
		json_str(k->name);
		printf(", \"type\": \"%s\", \"where\": \"%s\", \"env\": ", type_names[k->type], where_names[k->where]);
		json_str(k->env);
		printf(", \"default\": ");
		json_str(k->def);
		printf(", \"min\": %llu, \"max\": %llu, \"choices\": ", (unsigned long long)k->min,
		       (unsigned long long)k->max);
		json_str(k->choices);
		printf(", \"opt\": %s, \"run\": %s, \"attach\": %s, \"flag\": ", k->scope & FM_KS_OPT ? "true" : "false",
		       k->scope & FM_KS_RUN ? "true" : "false", k->scope & FM_KS_ATTACH ? "true" : "false");
		json_str(k->flag);
		printf(", \"metavar\": ");
		json_str(k->metavar);
		printf(", \"help\": ");
		json_str(k->help);
		/* The pager's own copy of the list (config.c) must be this one, in the same order. */
		printf(", \"in_pager\": %s}%s\n", pk == &fm_knobs[i] ? "true" : "false", i + 1 < NKNOBS ? "," : "");
	}
	puts("]");
}

/* One knob's value in o, as a user would write it back. */
static void value(const struct fm_agent_opts *o, const struct fm_knob *k)
{
	const char *field = (const char *)o + k->off;
	unsigned u;
	int idx;
	uint64_t v;

	switch (k->type) {
	case FM_KT_UINT:
	case FM_KT_PCT:
	case FM_KT_BOOL:
		memcpy(&u, field, sizeof(u));
		printf("%u", u);
		break;
	case FM_KT_SIZE:
		memcpy(&v, field, sizeof(v));
		printf("%llu", (unsigned long long)v);
		break;
	case FM_KT_LOCAL:
		if (o->cfg.local_bytes)
			printf("\"%llu\"", (unsigned long long)o->cfg.local_bytes);
		else
			printf("\"%u%%\"", o->cfg.local_pct);
		break;
	case FM_KT_ENUM: {
		const char *c = k->choices;
		memcpy(&idx, field, sizeof(idx));
		for (int i = 0; i < idx && *c; i++)
			c += strcspn(c, "|") + (c[strcspn(c, "|")] == '|');
		printf("\"%.*s\"", (int)strcspn(c, "|"), c);
		break;
	}
	case FM_KT_FLAG:
		memcpy(&idx, field, sizeof(idx));
		printf("%d", idx);
		break;
	case FM_KT_SECRET:
		json_str(o->cfg.secret);
		break;
	default:
		json_str(field);
	}
}

static void values(const struct fm_agent_opts *o)
{
	int first = 1;

	putchar('{');
	for (size_t i = 0; i < NKNOBS; i++) {
		if (knobs[i].where == FM_KW_CLI)
			continue;
		printf("%s", first ? "" : ", ");
		json_str(knobs[i].name);
		printf(": ");
		value(o, &knobs[i]);
		first = 0;
	}
	puts("}");
}

int main(int argc, char **argv)
{
	static struct fm_agent_opts o;
	char err[512];

	if (argc == 2 && !strcmp(argv[1], "table")) {
		table();
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "env")) {
		if (fm_pager_cfg_from_env(&o.cfg, err, sizeof(err)))
			goto refused;
		values(&o);
		return 0;
	}
	if ((argc == 2 || argc == 3) && !strcmp(argv[1], "agent")) {
		if (fm_agent_parse_options(argc == 3 ? argv[2] : NULL, &o, err, sizeof(err)))
			goto refused;
		values(&o);
		return 0;
	}
	if (argc == 4 && !strcmp(argv[1], "set")) {
		fm_pager_cfg_defaults(&o.cfg);
		if (fm_pager_cfg_set(&o.cfg, argv[2], argv[3], err, sizeof(err)))
			goto refused;
		values(&o);
		return 0;
	}
	fprintf(stderr, "usage: farmem-knobs table | env | agent [OPTIONS] | set KEY VALUE\n");
	return 2;
refused:
	fprintf(stderr, "%s\n", err);
	return 1;
}
