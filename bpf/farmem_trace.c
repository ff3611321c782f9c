// SPDX-License-Identifier: Apache-2.0
/*
 * farmem-trace: page faults, userfaultfd waits, reclaim and GC phases of
 * processes, per process and per thread, as JSON lines on stdout.
 *
 * Output (one JSON object per line; docs/observability.md is the reference):
 *   {"type":"start", ...features...}            once, after attaching
 *   {"type":"fault"|"major"|"gc_begin"|"gc_end"|"reclaim", ...}   with -e
 *   {"type":"stats", "procs":[...]}             every -i milliseconds
 *   {"type":"end", ...}                         at exit
 *
 * Exit status: 0 done (duration elapsed, SIGINT/SIGTERM, every traced pid
 * gone), 1 runtime error, 2 usage error, 3 eBPF not permitted or not
 * supported here (farmem run/stat work without it).
 */
#include <argp.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <bpf/libbpf.h>
#include <bpf/bpf.h>
#include "farmem_trace.h"
#include "farmem_trace.skel.h"

#define EXIT_NOBPF 3
#define MAX_PROCS 4096
#define MAX_JVMS 8

static struct env {
	__u32 pids[FMT_MAX_PIDS];
	int npids;
	long interval_ms;
	long duration_s;
	__u32 events;
	const char *jvms[MAX_JVMS];
	int njvms;
	bool threads;
	bool verbose;
	bool all;     /* --all: every process, with the full (costly) probes */
} env = { .interval_ms = 1000, .events = 0, .threads = true };

static volatile sig_atomic_t exiting;

const char *argp_program_version = "farmem-trace 0.1";
static const char doc[] =
"Trace page faults, userfaultfd waits, reclaim and GC phases; print JSON lines.\n"
"\n"
"USAGE: farmem-trace [-p PID]... [-i MS] [-d SEC] [-e EVENTS] [-j LIBJVM]...\n"
"\n"
"EVENTS is a comma list of fault,major,gc,reclaim (or all, none; default none):\n"
"the events to print one by one. Per-process and per-thread totals are printed\n"
"every -i milliseconds in any case.\n"
"\n"
"EXAMPLES:\n"
"    farmem-trace -p 1234                 # totals of pid 1234 every second\n"
"    farmem-trace -p 1234 -e fault,gc -d 10   # every fault and GC phase, 10 s\n"
"    farmem-trace -i 500                  # every farmem process, every 0.5 s\n"
"\n"
"With no -p, the farmem processes (those holding a farmem-map memfd, found\n"
"again every interval) are traced on the cheap path: no per-fault perf event\n"
"program and no stack walk (major/minor counts come from /proc, fault latency\n"
"covers the faults that block). -p and --all trace with every probe.\n"
"\n"
"Exit status: 0 done, 1 error, 2 usage, 3 eBPF not permitted or not supported.\n";

static const struct argp_option opts[] = {
	{ "pid", 'p', "PID", 0, "Trace this process (repeatable, up to 64)", 0 },
	{ "interval", 'i', "MS", 0, "Print totals every MS milliseconds (0: only at exit; default 1000)", 0 },
	{ "duration", 'd', "SEC", 0, "Stop after SEC seconds (default: until Ctrl-C or the pids exit)", 0 },
	{ "events", 'e', "EVENTS", 0, "Events to print one by one: fault,major,gc,reclaim,all,none", 0 },
	{ "jvm", 'j', "LIBJVM", 0, "libjvm.so for the GC probes (repeatable; default: the traced "
	  "pids' own, else /usr/lib/jvm/*/lib/server/libjvm.so)", 0 },
	{ "all", 'a', NULL, 0, "Without -p: trace every process with every probe (costly)", 0 },
	{ "no-threads", 'T', NULL, 0, "Leave the per-thread lists out of the totals", 0 },
	{ "verbose", 'v', NULL, 0, "libbpf debug output on stderr", 0 },
	{},
};

static long parse_long(const char *s, long lo, long hi, struct argp_state *state, const char *what)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		argp_error(state, "bad %s '%s' (give %ld to %ld)", what, s, lo, hi);
		return 0;
	}
	return v;
}

static int parse_events(const char *arg, __u32 *out)
{
	char buf[128], *save = NULL, *tok;
	__u32 ev = 0;

	if (strlen(arg) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, arg);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "fault")) ev |= FMT_EV_FAULT;
		else if (!strcmp(tok, "major")) ev |= FMT_EV_MAJOR;
		else if (!strcmp(tok, "gc")) ev |= FMT_EV_GC;
		else if (!strcmp(tok, "reclaim")) ev |= FMT_EV_RECLAIM;
		else if (!strcmp(tok, "all")) ev |= FMT_EV_FAULT | FMT_EV_MAJOR | FMT_EV_GC | FMT_EV_RECLAIM;
		else if (!strcmp(tok, "none")) ev = 0;
		else return -EINVAL;
	}
	*out = ev;
	return 0;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	switch (key) {
	case 'p':
		if (env.npids >= FMT_MAX_PIDS)
			argp_error(state, "at most %d pids", FMT_MAX_PIDS);
		env.pids[env.npids++] = (__u32)parse_long(arg, 1, INT_MAX, state, "pid");
		break;
	case 'i':
		env.interval_ms = parse_long(arg, 0, 3600 * 1000, state, "interval");
		break;
	case 'd':
		env.duration_s = parse_long(arg, 1, 365L * 86400, state, "duration");
		break;
	case 'e':
		if (parse_events(arg, &env.events))
			argp_error(state, "bad event list '%s' (fault,major,gc,reclaim,all,none)", arg);
		break;
	case 'j':
		if (env.njvms >= MAX_JVMS)
			argp_error(state, "at most %d -j", MAX_JVMS);
		env.jvms[env.njvms++] = arg;
		break;
	case 'a':
		env.all = true;
		break;
	case 'T':
		env.threads = false;
		break;
	case 'v':
		env.verbose = true;
		break;
	case ARGP_KEY_ARG:
		argp_usage(state);
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static int libbpf_print_fn(enum libbpf_print_level level, const char *fmt, va_list args)
{
	if (level == LIBBPF_DEBUG && !env.verbose)
		return 0;
	if (level == LIBBPF_WARN && !env.verbose)
		return 0;  /* failures are reported by us, with what they cost */
	return vfprintf(stderr, fmt, args);
}

static void sig_handler(int sig)
{
	exiting = 1;
}

/* --- helpers ---------------------------------------------------------------------------- */

static __u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);  /* the clock of bpf_ktime_get_ns() */
	return (__u64)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static double wall_time(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Write s as a JSON string body (comm names may hold anything). */
static void json_str(FILE *f, const char *s, size_t max)
{
	fputc('"', f);
	for (size_t i = 0; i < max && s[i]; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static int read_comm(__u32 pid, __u32 tid, char *out, size_t n)
{
	char path[64];
	FILE *f;

	if (tid)
		snprintf(path, sizeof(path), "/proc/%u/task/%u/comm", pid, tid);
	else
		snprintf(path, sizeof(path), "/proc/%u/comm", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	if (!fgets(out, (int)n, f)) {
		fclose(f);
		return -EIO;
	}
	fclose(f);
	out[strcspn(out, "\n")] = 0;
	return 0;
}

/*
 * GC or application thread, by name. HotSpot names its collector threads
 * (JDK 17: "GC Thread#N", "G1 Main Marker", "G1 Conc#N", "G1 Refine#N",
 * "G1 Service", "VM Thread" which runs the pauses; ZGC "ZWorker"/"ZDriver";
 * Shenandoah "Shenandoah GC Threads"; Parallel "ParGC Thread").
 */
static bool gc_thread(const char *comm)
{
	static const char *const pfx[] = { "GC Thread", "G1 ", "VM Thread", "ParGC", "ZWorker",
		"ZDriver", "ZDirector", "ZStat", "Shenandoah", "ConcGC", "Conc#" };

	for (size_t i = 0; i < sizeof(pfx) / sizeof(pfx[0]); i++)
		if (!strncmp(comm, pfx[i], strlen(pfx[i])))
			return true;
	return false;
}

/* [lo, hi) of handle_userfault from /proc/kallsyms: its address to the next symbol's. */
static int uffd_range(__u64 *lo, __u64 *hi)
{
	FILE *f = fopen("/proc/kallsyms", "re");
	char line[256], name[200], type;
	unsigned long long a, start = 0, next = ULLONG_MAX;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %199s", &a, &type, name) != 3)
			continue;
		if (!strcmp(name, "handle_userfault"))
			start = a;
	}
	if (!start) {
		fclose(f);
		return -ENOENT;  /* also when kptr_restrict hides addresses: they read as 0 */
	}
	rewind(f);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %199s", &a, &type, name) == 3 && a > start && a < next)
			next = a;
	}
	fclose(f);
	if (next == ULLONG_MAX || next - start > 1 << 20)
		return -ERANGE;
	*lo = start;
	*hi = next;
	return 0;
}

/* libjvm.so paths: -j, else the traced pids' own, else every installed JDK's. */
static int find_jvms(char paths[MAX_JVMS][PATH_MAX])
{
	int n = 0;

	for (int i = 0; i < env.njvms && n < MAX_JVMS; i++)
		if (realpath(env.jvms[i], paths[n]))
			n++;
	if (env.njvms)
		return n;
	for (int i = 0; i < env.npids && n < MAX_JVMS; i++) {
		char mp[64], line[PATH_MAX + 128];
		FILE *f;

		snprintf(mp, sizeof(mp), "/proc/%u/maps", env.pids[i]);
		f = fopen(mp, "re");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			char *p = strchr(line, '/');

			if (!p || !strstr(p, "/libjvm.so"))
				continue;
			p[strcspn(p, "\n")] = 0;
			bool dup = false;
			for (int k = 0; k < n; k++)
				dup |= !strcmp(paths[k], p);
			if (!dup && n < MAX_JVMS)
				snprintf(paths[n++], PATH_MAX, "%s", p);
		}
		fclose(f);
	}
	if (n || env.npids)
		return n;
	glob_t g;
	if (glob("/usr/lib/jvm/*/lib/server/libjvm.so", 0, NULL, &g) == 0) {
		for (size_t i = 0; i < g.gl_pathc && n < MAX_JVMS; i++) {
			char rp[PATH_MAX];
			bool dup = false;

			if (!realpath(g.gl_pathv[i], rp))
				continue;
			for (int k = 0; k < n; k++)
				dup |= !strcmp(paths[k], rp);
			if (!dup)
				snprintf(paths[n++], PATH_MAX, "%s", rp);
		}
		globfree(&g);
	}
	return n;
}

/* --- system-wide mode: the farmem pid set, fault counts from /proc ------------------------- */

static bool sys_mode;  /* no -p and no --all */

/* minflt and majflt of /proc/PID/stat or /proc/PID/task/TID/stat (tid 0: the process). */
static int read_faults(__u32 pid, __u32 tid, __u64 *minf, __u64 *majf)
{
	char path[64], buf[1024], *p;
	unsigned long long mi, ma;
	FILE *f;
	size_t n;

	if (tid)
		snprintf(path, sizeof(path), "/proc/%u/task/%u/stat", pid, tid);
	else
		snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %llu %*u %llu", &mi, &ma) != 2)
		return -EINVAL;
	*minf = mi;
	*majf = ma;
	return 0;
}

static __u32 pidset[FMT_PIDSET_MAX];
static int npidset;

/*
 * Map `pids` := the processes holding a farmem-map memfd (FMT_PID_TRACE), with
 * FMT_PID_UFFD when they also hold a userfaultfd (the uffd pager; kswap mode has none).
 */
static void refresh_pidset(int mfd)
{
	static __u32 now[FMT_PIDSET_MAX];
	int nnow = 0;
	DIR *d = opendir("/proc"), *fd;
	struct dirent *de, *fe;
	char path[300], link[128];

	if (!d)
		return;
	while ((de = readdir(d)) && nnow < FMT_PIDSET_MAX) {
		char *end;
		unsigned long pid = strtoul(de->d_name, &end, 10);
		__u8 flags = 0;

		if (*end || !pid)
			continue;
		snprintf(path, sizeof(path), "/proc/%lu/fd", pid);
		fd = opendir(path);
		if (!fd)
			continue;
		while ((fe = readdir(fd))) {
			ssize_t n;

			if (fe->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/proc/%lu/fd/%s", pid, fe->d_name);
			n = readlink(path, link, sizeof(link) - 1);
			if (n <= 0)
				continue;
			link[n] = 0;
			if (!strncmp(link, "/memfd:farmem-map", 17))
				flags |= FMT_PID_TRACE;
			else if (!strcmp(link, "anon_inode:[userfaultfd]"))
				flags |= FMT_PID_UFFD;
		}
		closedir(fd);
		if (!(flags & FMT_PID_TRACE))
			continue;
		now[nnow++] = (__u32)pid;
		bpf_map_update_elem(mfd, &(__u32){(__u32)pid}, &flags, BPF_ANY);
	}
	closedir(d);
	for (int i = 0; i < npidset; i++) {
		bool keep = false;

		for (int k = 0; k < nnow && !keep; k++)
			keep = now[k] == pidset[i];
		if (!keep)
			bpf_map_delete_elem(mfd, &pidset[i]);
	}
	memcpy(pidset, now, nnow * sizeof(now[0]));
	npidset = nnow;
}

/* --- events ------------------------------------------------------------------------------ */

static __u64 mono0;     /* now_ns() at start: event times are relative to it */
static double wall0;

static int handle_event(void *ctx, void *data, size_t size)
{
	const struct fmt_event *e = data;
	static const char *const names[] = { "?", "fault", "major", "gc_begin", "gc_end", "reclaim" };
	FILE *f = stdout;

	if (size < sizeof(*e))
		return 0;
	fprintf(f, "{\"type\":\"%s\",\"t\":%.6f,\"pid\":%u,\"tid\":%u,\"comm\":",
		e->type < 6 ? names[e->type] : "?", (double)(__s64)(e->ts - mono0) / 1e9, e->pid, e->tid);
	json_str(f, e->comm, sizeof(e->comm));
	switch (e->type) {
	case FMT_FAULT:
		fprintf(f, ",\"addr\":%llu,\"err\":%llu,\"gc\":%s", (unsigned long long)e->addr,
			(unsigned long long)e->arg, gc_thread(e->comm) ? "true" : "false");
		break;
	case FMT_MAJOR:
		fprintf(f, ",\"addr\":%llu,\"gc\":%s", (unsigned long long)e->addr,
			gc_thread(e->comm) ? "true" : "false");
		break;
	case FMT_GC_BEGIN:
		fprintf(f, ",\"full\":%s", e->arg ? "true" : "false");
		break;
	case FMT_GC_END:
		fprintf(f, ",\"dur_ns\":%llu", (unsigned long long)e->dur_ns);
		break;
	case FMT_RECLAIM:
		fprintf(f, ",\"reclaimed\":%llu,\"dur_ns\":%llu", (unsigned long long)e->arg,
			(unsigned long long)e->dur_ns);
		break;
	}
	fputs("}\n", f);
	return 0;
}

/* --- totals --------------------------------------------------------------------------------- */

/* Counters of one process: the live threads' (from the map) plus those that exited. */
struct proc_tot {
	__u32 pid;
	bool used;
	struct fmt_tstat gone;  /* folded counters of exited threads */
	__u64 gone_gc_faults;
	__u64 last_min, last_maj;  /* system-wide mode: /proc/PID/stat, as last read */
	/* per report */
	struct fmt_tstat sum;
	__u64 gc_faults;
	int nthreads;
};

static struct proc_tot procs[MAX_PROCS];

/* GC or not, by tid, as last seen alive: an exited thread's name is gone with it. */
#define TID_CACHE 65536
static __u32 gc_tid[TID_CACHE];  /* tid + 1 of a GC thread at slot tid % TID_CACHE, else 0 */

static struct proc_tot *proc_get(__u32 pid, bool create)
{
	struct proc_tot *freep = NULL;

	for (int i = 0; i < MAX_PROCS; i++) {
		if (procs[i].used && procs[i].pid == pid)
			return &procs[i];
		if (!procs[i].used && !freep)
			freep = &procs[i];
	}
	if (!create || !freep)
		return NULL;
	memset(freep, 0, sizeof(*freep));
	freep->used = true;
	freep->pid = pid;
	return freep;
}

static void tstat_add(struct fmt_tstat *dst, const struct fmt_tstat *s)
{
	dst->pf_user += s->pf_user;
	dst->pf_write += s->pf_write;
	dst->pf_prot += s->pf_prot;
	dst->maj += s->maj;
	dst->min += s->min;
	dst->fault_ns += s->fault_ns;
	dst->maj_ns += s->maj_ns;
	dst->uffd_waits += s->uffd_waits;
	dst->uffd_wait_ns += s->uffd_wait_ns;
	dst->fault_block_ns += s->fault_block_ns;
	dst->reclaims += s->reclaims;
	dst->reclaim_ns += s->reclaim_ns;
	dst->reclaimed += s->reclaimed;
	dst->sig_faults += s->sig_faults;
	for (int i = 0; i < FMT_LAT_SLOTS; i++)
		dst->lat_hist[i] += s->lat_hist[i];
}

static void print_counters(FILE *f, const struct fmt_tstat *t)
{
	fprintf(f, "\"pf_user\":%llu,\"pf_write\":%llu,\"pf_prot\":%llu,\"maj\":%llu,\"min\":%llu,"
		"\"fault_ns\":%llu,\"maj_ns\":%llu,\"uffd_waits\":%llu,\"uffd_wait_ns\":%llu,"
		"\"fault_block_ns\":%llu,\"reclaims\":%llu,\"reclaim_ns\":%llu,\"reclaimed\":%llu",
		(unsigned long long)t->pf_user, (unsigned long long)t->pf_write,
		(unsigned long long)t->pf_prot, (unsigned long long)t->maj,
		(unsigned long long)t->min, (unsigned long long)t->fault_ns,
		(unsigned long long)t->maj_ns, (unsigned long long)t->uffd_waits,
		(unsigned long long)t->uffd_wait_ns, (unsigned long long)t->fault_block_ns,
		(unsigned long long)t->reclaims, (unsigned long long)t->reclaim_ns,
		(unsigned long long)t->reclaimed);
}

static bool proc_alive(__u32 pid)
{
	char p[64];

	snprintf(p, sizeof(p), "/proc/%u", pid);
	return access(p, F_OK) == 0;
}

static bool thread_alive(__u32 pid, __u32 tid)
{
	char p[64];

	snprintf(p, sizeof(p), "/proc/%u/task/%u", pid, tid);
	return access(p, F_OK) == 0;
}

/* One "stats" line. Returns the number of traced processes still alive. */
static int report(struct farmem_trace *skel, bool final)
{
	int tfd = bpf_map__fd(skel->maps.tstats), gfd = bpf_map__fd(skel->maps.gcstats);
	int glfd = bpf_map__fd(skel->maps.globals);
	__u32 key, next, *kp = NULL;
	struct fmt_tstat t;
	static struct tline { struct fmt_tstat t; char comm[FMT_COMM_LEN]; } *tl; /* this report's threads */
	static size_t tl_cap;
	static __u32 *dead;                /* exited threads, deleted after the walk */
	static size_t dead_cap;
	size_t nt = 0, ndead = 0;
	int alive = 0;
	FILE *f = stdout;

	for (int i = 0; i < MAX_PROCS; i++) {
		if (!procs[i].used)
			continue;
		procs[i].sum = procs[i].gone;
		procs[i].gc_faults = procs[i].gone_gc_faults;
		procs[i].nthreads = 0;
	}
	for (int i = 0; i < env.npids; i++)
		proc_get(env.pids[i], true);

	while (bpf_map_get_next_key(tfd, kp, &next) == 0) {
		key = next;
		kp = &key;
		if (bpf_map_lookup_elem(tfd, &key, &t))
			continue;
		struct proc_tot *p = proc_get(t.pid, true);
		char comm[FMT_COMM_LEN] = "";

		if (!p)
			continue;
		if (read_comm(t.pid, t.tid, comm, sizeof(comm)) < 0 && !thread_alive(t.pid, t.tid)) {
			/* exited: fold into the process and forget the thread */
			tstat_add(&p->gone, &t);
			tstat_add(&p->sum, &t);
			if (gc_tid[t.tid % TID_CACHE] == t.tid + 1) {
				p->gone_gc_faults += t.pf_user;
				p->gc_faults += t.pf_user;
			}
			/* its name is gone with it; GC threads live as long as the JVM.
			 * Deleting during get_next_key would restart the walk: later. */
			if (ndead == dead_cap) {
				size_t cap = dead_cap ? dead_cap * 2 : 256;
				void *n2 = realloc(dead, cap * sizeof(*dead));

				if (!n2)
					continue;
				dead = n2;
				dead_cap = cap;
			}
			dead[ndead++] = key;
			continue;
		}
		if (sys_mode)
			read_faults(t.pid, t.tid, &t.min, &t.maj);
		t.min += t.sig_faults;  /* faults served in the thread's SIGBUS handler are minor too */
		tstat_add(&p->sum, &t);
		p->nthreads++;
		if (gc_thread(comm)) {
			p->gc_faults += t.pf_user;
			gc_tid[t.tid % TID_CACHE] = t.tid + 1;
		}
		if (env.threads) {
			if (nt == tl_cap) {
				size_t cap = tl_cap ? tl_cap * 2 : 256;
				void *n2 = realloc(tl, cap * sizeof(*tl));

				if (!n2)
					continue;
				tl = n2;
				tl_cap = cap;
			}
			tl[nt].t = t;
			memcpy(tl[nt].comm, comm, sizeof(comm));
			nt++;
		}
	}

	for (size_t k = 0; k < ndead; k++)
		bpf_map_delete_elem(tfd, &dead[k]);

	__u64 g[FMT_G_MAX] = {};
	for (__u32 i = 0; i < FMT_G_MAX; i++)
		bpf_map_lookup_elem(glfd, &i, &g[i]);

	fprintf(f, "{\"type\":\"stats\",\"t\":%.6f,\"time\":%.3f,\"final\":%s,"
		"\"kswapd_wakes\":%llu,\"shrink_reclaimed\":%llu,\"memcg_reclaims\":%llu,"
		"\"direct_reclaims\":%llu,\"events_lost\":%llu,\"procs\":[",
		(double)(now_ns() - mono0) / 1e9, wall_time(), final ? "true" : "false",
		(unsigned long long)g[FMT_G_KSWAPD_WAKE], (unsigned long long)g[FMT_G_SHRINK_RECLAIMED],
		(unsigned long long)g[FMT_G_MEMCG_RECLAIM], (unsigned long long)g[FMT_G_DIRECT_RECLAIM],
		(unsigned long long)g[FMT_G_EVENTS_LOST]);
	bool first = true;
	for (int i = 0; i < MAX_PROCS; i++) {
		struct proc_tot *p = &procs[i];
		struct fmt_gcstat gc = {};
		char comm[FMT_COMM_LEN] = "";
		bool live;

		if (!p->used)
			continue;
		live = proc_alive(p->pid);
		alive += live;
		if (sys_mode) {
			/* the process's own counts hold its exited threads too */
			__u64 mi, ma;

			if (read_faults(p->pid, 0, &mi, &ma) == 0) {
				p->last_min = mi;
				p->last_maj = ma;
			}
			p->sum.min = p->last_min + p->sum.sig_faults;
			p->sum.maj = p->last_maj;
		}
		read_comm(p->pid, 0, comm, sizeof(comm));
		bpf_map_lookup_elem(gfd, &p->pid, &gc);
		fprintf(f, "%s{\"pid\":%u,\"comm\":", first ? "" : ",", p->pid);
		first = false;
		json_str(f, comm, sizeof(comm));
		fprintf(f, ",\"alive\":%s,\"nthreads\":%d,", live ? "true" : "false", p->nthreads);
		print_counters(f, &p->sum);
		fprintf(f, ",\"gc_faults\":%llu,\"app_faults\":%llu,\"lat_hist\":[",
			(unsigned long long)p->gc_faults,
			(unsigned long long)(p->sum.pf_user - p->gc_faults));
		for (int s = 0; s < FMT_LAT_SLOTS; s++)
			fprintf(f, "%s%llu", s ? "," : "", (unsigned long long)p->sum.lat_hist[s]);
		fprintf(f, "],\"gc\":{\"begins\":%llu,\"ends\":%llu,\"gc_ns\":%llu,\"active\":%s,"
			"\"full\":%s}", (unsigned long long)gc.begins, (unsigned long long)gc.ends,
			(unsigned long long)gc.gc_ns, gc.begin_ts ? "true" : "false",
			gc.full ? "true" : "false");
		if (env.threads) {
			bool tfirst = true;

			fputs(",\"threads\":[", f);
			for (size_t k = 0; k < nt; k++) {
				const char *tc = tl[k].comm;

				if (tl[k].t.pid != p->pid)
					continue;
				fprintf(f, "%s{\"tid\":%u,\"comm\":", tfirst ? "" : ",", tl[k].t.tid);
				tfirst = false;
				json_str(f, tc, FMT_COMM_LEN);
				fprintf(f, ",\"gc\":%s,", gc_thread(tc) ? "true" : "false");
				print_counters(f, &tl[k].t);
				fputc('}', f);
			}
			fputc(']', f);
		}
		fputc('}', f);
		if (!live && !env.npids) {
			/* a process that exited is reported once more, then forgotten */
			bpf_map_delete_elem(gfd, &p->pid);
			p->used = false;
		}
	}
	fputs("]}\n", f);
	fflush(f);
	return alive;
}

/* --- attaching ------------------------------------------------------------------------------- */

static int open_perf(struct bpf_program *prog, __u64 config, struct bpf_link **links, int *nlinks,
		     int max)
{
	long ncpu = sysconf(_SC_NPROCESSORS_CONF);
	int ok = 0, err = 0;

	for (long cpu = 0; cpu < ncpu && *nlinks < max; cpu++) {
		struct perf_event_attr attr = {
			.type = PERF_TYPE_SOFTWARE,
			.size = sizeof(attr),
			.config = config,
			.sample_period = 1,
		};
		int fd = (int)syscall(__NR_perf_event_open, &attr, -1, (int)cpu, -1, PERF_FLAG_FD_CLOEXEC);

		if (fd < 0) {
			if (errno == ENODEV)  /* offline CPU */
				continue;
			err = -errno;
			continue;
		}
		struct bpf_link *l = bpf_program__attach_perf_event(prog, fd);

		if (!l) {
			err = -errno;
			close(fd);
			continue;
		}
		links[(*nlinks)++] = l;
		ok++;
	}
	return ok ? 0 : (err ? err : -ENODEV);
}

static const char *feat(int err)
{
	return err ? "false" : "true";
}

int main(int argc, char **argv)
{
	static const struct argp argp = { .options = opts, .parser = parse_arg, .doc = doc };
	struct farmem_trace *skel = NULL;
	struct ring_buffer *rb = NULL;
	struct bpf_link *links[1024];
	int nlinks = 0, err;
	__u64 lo = 0, hi = 0;
	char jvms[MAX_JVMS][PATH_MAX];
	int njvm;

	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return 2;
	libbpf_set_print(libbpf_print_fn);

	int uerr = uffd_range(&lo, &hi);
	if (uerr && env.verbose)
		fprintf(stderr, "farmem-trace: handle_userfault not found in /proc/kallsyms (%s): "
			"userfaultfd waits are not told apart\n", strerror(-uerr));

	skel = farmem_trace__open();
	if (!skel) {
		err = -errno;
		fprintf(stderr, "farmem-trace: cannot open the BPF object: %s\n", strerror(errno));
		goto cleanup;
	}
	skel->rodata->targ_pid = env.npids == 1 ? env.pids[0] : 0;
	sys_mode = env.npids == 0 && !env.all;
	skel->rodata->targ_pid_map = env.npids > 1 || sys_mode;
	skel->rodata->sys_mode = sys_mode;
	skel->rodata->targ_events = env.events;
	skel->rodata->uffd_lo = lo;
	skel->rodata->uffd_hi = hi;

	mono0 = now_ns();  /* before attaching: no event is older */
	err = farmem_trace__load(skel);
	if (err) {
		int e = errno ? errno : -err;

		fprintf(stderr, "farmem-trace: cannot load the eBPF programs: %s%s\n", strerror(e),
			(e == EPERM || e == EACCES) ?
			" (needs root, or CAP_BPF + CAP_PERFMON; farmem run and farmem stat work without it)" :
			" (this kernel lacks BTF tracepoints or eBPF; farmem run and farmem stat work without it)");
		err = -EXIT_NOBPF;
		goto cleanup;
	}
	for (int i = 0; i < env.npids; i++) {
		__u8 one = 1;

		bpf_map_update_elem(bpf_map__fd(skel->maps.pids), &env.pids[i], &one, BPF_ANY);
	}
	if (sys_mode)
		refresh_pidset(bpf_map__fd(skel->maps.pids));

	/* tracepoints: the fault tracepoint is required, the rest are features */
	struct bpf_program *tps[] = { skel->progs.on_fault, skel->progs.on_switch,
		skel->progs.on_memcg_begin, skel->progs.on_memcg_end, skel->progs.on_direct_begin,
		skel->progs.on_direct_end, skel->progs.on_kswapd_wake, skel->progs.on_shrink_inactive,
		skel->progs.on_signal, skel->progs.on_sys_enter };
	int tp_err[10] = {};
	for (int i = 0; i < 10; i++) {
		struct bpf_link *l = bpf_program__attach(tps[i]);

		if (!l) {
			tp_err[i] = -errno;
			continue;
		}
		links[nlinks++] = l;
	}
	if (tp_err[0]) {
		int e = -tp_err[0];

		fprintf(stderr, "farmem-trace: cannot attach to exceptions:page_fault_user: %s%s\n",
			strerror(e), (e == EPERM || e == EACCES) ? " (needs root)" : "");
		err = -EXIT_NOBPF;
		goto cleanup;
	}
	int maj_err = 0, min_err = 0;
	if (!sys_mode) {  /* system-wide mode reads the counts from /proc instead */
		maj_err = open_perf(skel->progs.on_major, PERF_COUNT_SW_PAGE_FAULTS_MAJ, links, &nlinks, 512);
		min_err = open_perf(skel->progs.on_minor, PERF_COUNT_SW_PAGE_FAULTS_MIN, links, &nlinks, 1000);
	}
	if (maj_err || min_err)
		fprintf(stderr, "farmem-trace: perf page-fault events unavailable (%s): no major/minor "
			"split and no fault latency\n", strerror(-(maj_err ? maj_err : min_err)));

	njvm = find_jvms(jvms);
	int gc_ok = 0;
	for (int i = 0; i < njvm; i++) {
		pid_t pids_to[FMT_MAX_PIDS];
		int np = 0;

		if (env.npids) {
			for (int k = 0; k < env.npids; k++)
				pids_to[np++] = (pid_t)env.pids[k];
		} else {
			pids_to[np++] = -1;
		}
		for (int k = 0; k < np && nlinks < 1020; k++) {
			struct bpf_link *b = bpf_program__attach_usdt(skel->progs.on_gc_begin, pids_to[k],
								      jvms[i], "hotspot", "gc__begin", NULL);
			struct bpf_link *e = bpf_program__attach_usdt(skel->progs.on_gc_end, pids_to[k],
								      jvms[i], "hotspot", "gc__end", NULL);
			if (b)
				links[nlinks++] = b;
			if (e)
				links[nlinks++] = e;
			/* a pid that does not map this libjvm fails here: that is expected */
			gc_ok += b && e;
		}
	}

	rb = ring_buffer__new(bpf_map__fd(skel->maps.events), handle_event, NULL, NULL);
	if (!rb) {
		err = -errno;
		fprintf(stderr, "farmem-trace: cannot open the ring buffer: %s\n", strerror(errno));
		goto cleanup;
	}
	signal(SIGINT, sig_handler);
	signal(SIGTERM, sig_handler);
	signal(SIGPIPE, sig_handler);

	wall0 = wall_time() - (double)(now_ns() - mono0) / 1e9;
	printf("{\"type\":\"start\",\"time\":%.3f,\"pids\":[", wall0);
	for (int i = 0; i < env.npids; i++)
		printf("%s%u", i ? "," : "", env.pids[i]);
	printf("],\"interval_ms\":%ld,\"features\":{\"page_fault_user\":true,\"major_minor\":%s,"
	       "\"uffd_wait\":%s,\"reclaim\":%s,\"gc\":%s},\"uffd_range\":[%llu,%llu],\"jvms\":[",
	       env.interval_ms, (maj_err || min_err) ? "false" : "true",
	       ((uerr && !sys_mode) || tp_err[1]) ? "false" : "true", feat(tp_err[2] | tp_err[3]),
	       gc_ok ? "true" : "false", (unsigned long long)lo, (unsigned long long)hi);
	for (int i = 0; i < njvm; i++) {
		printf("%s", i ? "," : "");
		json_str(stdout, jvms[i], PATH_MAX);
	}
	printf("],\"lat_slots\":\"log2 ns\",\"mode\":\"%s\"}\n",
	       env.npids ? "pids" : sys_mode ? "farmem" : "all");
	fflush(stdout);

	__u64 next_report = env.interval_ms ? now_ns() + env.interval_ms * 1000000ull : 0;
	__u64 next_refresh = now_ns() + 1000000000ull;
	__u64 deadline = env.duration_s ? now_ns() + env.duration_s * 1000000000ull : 0;
	while (!exiting) {
		err = ring_buffer__poll(rb, 50);
		if (err == -EINTR) {
			err = 0;
			continue;
		}
		if (err < 0) {
			fprintf(stderr, "farmem-trace: polling the ring buffer: %s\n", strerror(-err));
			goto cleanup;
		}
		err = 0;
		fflush(stdout);
		__u64 now = now_ns();
		if (deadline && now >= deadline)
			break;
		if (sys_mode && now >= next_refresh) {
			/* new farmem processes are traced from their first second on */
			refresh_pidset(bpf_map__fd(skel->maps.pids));
			next_refresh = now + 1000000000ull;
		}
		if (next_report && now >= next_report) {
			next_report += env.interval_ms * 1000000ull;
			if (next_report < now)
				next_report = now + env.interval_ms * 1000000ull;
			if (report(skel, false) == 0 && env.npids)
				break;  /* every traced process is gone */
		}
		if (ferror(stdout))
			break;  /* the reader went away */
	}
	ring_buffer__consume(rb);
	report(skel, true);
	printf("{\"type\":\"end\",\"t\":%.6f}\n", (double)(now_ns() - mono0) / 1e9);
	fflush(stdout);

cleanup:
	ring_buffer__free(rb);
	for (int i = 0; i < nlinks; i++)
		bpf_link__destroy(links[i]);
	farmem_trace__destroy(skel);
	if (err == -EXIT_NOBPF)
		return EXIT_NOBPF;
	return err ? 1 : 0;
}
