// SPDX-License-Identifier: Apache-2.0
/*
 * farmem-trace, kernel side: page faults, major/minor faults, userfaultfd
 * waits, reclaim and HotSpot GC phases, per process and per thread.
 *
 * Only stable interfaces: tp_btf tracepoints, perf software events and USDT.
 * kprobes and fentry/fexit are not available on the machines farmem targets
 * (CONFIG_KPROBES=n, and BPF trampolines are refused with EPERM), so a
 * userfaultfd wait is recognised from the kernel stack of a thread that
 * blocks inside a page fault (handle_userfault on it), and a fault's latency
 * is the time from exceptions:page_fault_user (entry of the fault) to the
 * perf software event that mm_account_fault() raises when it completes.
 * tp_btf is used rather than classic tracepoints: it needs no tracefs
 * mount, and clang 14 cannot do CO-RE on trace_event_raw_* contexts.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/usdt.bpf.h>
#include "farmem_trace.h"

const volatile __u32 targ_pid = 0;      /* the one pid to trace, or 0 */
const volatile bool targ_pid_map = false; /* trace the pids in map `pids` */
const volatile __u32 targ_events = 0;   /* FMT_EV_* sent to the ring buffer */
const volatile __u64 uffd_lo = 0;       /* [uffd_lo, uffd_hi): handle_userfault's text */
const volatile __u64 uffd_hi = 0;
/*
 * System-wide mode (farmem-trace with no -p, as `farmem top` runs it): the
 * cheap path. Only the pids in map `pids` are traced (the loader keeps the
 * farmem processes there), no perf event program runs (the loader reads
 * major/minor counts from /proc), and a thread that blocks is in its
 * userfaultfd fault when its user ip is still the faulting ip and its process
 * holds a userfaultfd (FMT_PID_UFFD) -- no stack walk. Fault latency is then
 * measured for the faults that block: page_fault_user to the switch back in.
 */
const volatile bool sys_mode = false;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FMT_PIDSET_MAX);
	__type(key, __u32);
	__type(value, __u8);  /* FMT_PID_* */
} pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);  /* tid */
	__type(value, struct fmt_tstat);
} tstats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);  /* pid */
	__type(value, struct fmt_gcstat);
} gcstats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FMT_G_MAX);
	__type(key, __u32);
	__type(value, __u64);
} globals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

static const struct fmt_tstat zero_tstat;

static __always_inline bool wanted(__u32 pid)
{
	if (targ_pid)
		return pid == targ_pid;
	if (targ_pid_map) {
		__u8 *f = bpf_map_lookup_elem(&pids, &pid);

		return f && (*f & FMT_PID_TRACE);
	}
	return true;
}

static __always_inline void global_add(__u32 idx, __u64 v)
{
	__u64 *p = bpf_map_lookup_elem(&globals, &idx);

	if (p)
		__sync_fetch_and_add(p, v);
}

static __always_inline struct fmt_tstat *tstat_get(__u32 pid, __u32 tid)
{
	struct fmt_tstat *t = bpf_map_lookup_elem(&tstats, &tid);

	if (t)
		return t;
	bpf_map_update_elem(&tstats, &tid, &zero_tstat, BPF_NOEXIST);
	t = bpf_map_lookup_elem(&tstats, &tid);
	if (t) {
		t->pid = pid;
		t->tid = tid;
	}
	return t;
}

static __always_inline void emit(__u32 type, __u32 pid, __u32 tid, __u64 ts, __u64 addr,
				 __u64 arg, __u64 dur)
{
	struct fmt_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		global_add(FMT_G_EVENTS_LOST, 1);
		return;
	}
	e->ts = ts;
	e->addr = addr;
	e->arg = arg;
	e->dur_ns = dur;
	e->pid = pid;
	e->tid = tid;
	e->type = type;
	e->pad = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;

	/* unrolled binary search: the verifier wants bounded work */
	if (v >= 1ull << 32) { v >>= 32; r += 32; }
	if (v >= 1u << 16) { v >>= 16; r += 16; }
	if (v >= 1u << 8) { v >>= 8; r += 8; }
	if (v >= 1u << 4) { v >>= 4; r += 4; }
	if (v >= 1u << 2) { v >>= 2; r += 2; }
	if (v >= 1u << 1) { r += 1; }
	return r < FMT_LAT_SLOTS ? r : FMT_LAT_SLOTS - 1;
}

SEC("tp_btf/page_fault_user")
int BPF_PROG(on_fault, unsigned long address, struct pt_regs *regs, unsigned long error_code)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32, tid = (__u32)id;
	struct fmt_tstat *t;
	__u32 uffd = 0;
	__u64 now;

	if (sys_mode) {
		/* one lookup gives both: traced, and paged by userfaultfd */
		__u8 *f = bpf_map_lookup_elem(&pids, &pid);

		if (!f || !(*f & FMT_PID_TRACE))
			return 0;
		uffd = (*f & FMT_PID_UFFD) != 0;
	} else if (!wanted(pid)) {
		return 0;
	}
	t = tstat_get(pid, tid);
	if (!t)
		return 0;
	now = bpf_ktime_get_ns();
	t->pf_user++;
	if (error_code & 2)
		t->pf_write++;
	if (error_code & 1)
		t->pf_prot++;
	t->fault_start = now;
	if (sys_mode) {
		t->fault_ip = regs->ip;
		t->block_uffd = uffd;  /* what a block inside this fault will be */
	}
	if (targ_events & FMT_EV_FAULT)
		emit(FMT_FAULT, pid, tid, now, address, error_code, 0);
	return 0;
}

/* The fault that page_fault_user opened is accounted: close it. */
static __always_inline void fault_done(struct bpf_perf_event_data *ctx, bool major)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32, tid = (__u32)id;
	struct fmt_tstat *t;
	__u64 now, d;

	if (!wanted(pid))
		return;
	t = tstat_get(pid, tid);
	if (!t)
		return;
	now = bpf_ktime_get_ns();
	if (major)
		t->maj++;
	else
		t->min++;
	if (t->fault_start) {
		d = now - t->fault_start;
		t->fault_start = 0;
		t->fault_ns += d;
		if (major)
			t->maj_ns += d;
		t->lat_hist[log2_slot(d) & (FMT_LAT_SLOTS - 1)]++;
	}
	if (major && (targ_events & FMT_EV_MAJOR))
		emit(FMT_MAJOR, pid, tid, now, ctx->addr, 0, 0);
}

SEC("perf_event")
int on_major(struct bpf_perf_event_data *ctx)
{
	fault_done(ctx, true);
	return 0;
}

SEC("perf_event")
int on_minor(struct bpf_perf_event_data *ctx)
{
	fault_done(ctx, false);
	return 0;
}

/*
 * Off-CPU time inside a fault. At sched_switch, current is still prev, so
 * bpf_get_stack() reads the stack of the thread that blocks. Only threads
 * with a fault in progress pay for the stack walk.
 */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u32 ntid = next->pid, ptid = prev->pid;
	struct fmt_tstat *t;
	__u64 now = 0;

	t = bpf_map_lookup_elem(&tstats, &ntid);
	if (t && t->block_start) {
		now = bpf_ktime_get_ns();
		__u64 d = now - t->block_start;

		t->block_start = 0;
		if (t->block_uffd) {
			t->uffd_waits++;
			t->uffd_wait_ns += d;
		} else {
			t->fault_block_ns += d;
		}
		if (sys_mode && t->fault_start) {
			/* no perf event closes the fault here: the switch back in does */
			d = now - t->fault_start;
			t->fault_start = 0;
			t->fault_ns += d;
			t->lat_hist[log2_slot(d) & (FMT_LAT_SLOTS - 1)]++;
		}
	}
	if (preempt || prev_state == 0)
		return 0;  /* still runnable: not a wait */
	t = bpf_map_lookup_elem(&tstats, &ptid);
	if (!t || !t->fault_start)
		return 0;
	if (sys_mode) {
		/* still inside that fault? Its user ip is the faulting one until it returns. */
		struct pt_regs *r = (struct pt_regs *)bpf_task_pt_regs(prev);

		if (!r || r->ip != t->fault_ip) {
			t->fault_start = 0;  /* that fault ended without blocking */
			return 0;
		}
		t->block_start = now ? now : bpf_ktime_get_ns();  /* block_uffd: set by on_fault */
		return 0;
	}
	if (!now)
		now = bpf_ktime_get_ns();
	t->block_start = now;
	t->block_uffd = 0;
	if (uffd_lo) {
		__u64 stack[FMT_STACK_DEPTH];
		long n = bpf_get_stack(ctx, stack, sizeof(stack), 0);

		for (int i = 0; i < FMT_STACK_DEPTH; i++) {
			if (i * 8 >= n)
				break;
			if (stack[i] >= uffd_lo && stack[i] < uffd_hi) {
				t->block_uffd = 1;
				break;
			}
		}
	}
	return 0;
}

/*
 * fault=signal: the kernel does not block the fault in handle_userfault, it
 * sends the thread SIGBUS and the pager serves the fault in the handler; the
 * access then runs again and finds the page. So a userfaultfd fault is the
 * time from its page_fault_user to the handler's rt_sigreturn, and it is
 * counted as a minor fault (which the kernel does not count for it: the
 * fault ended in an error, and the retried access does not fault).
 */
SEC("tp_btf/signal_deliver")
int BPF_PROG(on_signal, int sig, struct kernel_siginfo *info, struct k_sigaction *ka)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct fmt_tstat *t;

	if (sig != 7 /* SIGBUS */ || !wanted(id >> 32))
		return 0;
	t = bpf_map_lookup_elem(&tstats, &(__u32){(__u32)id});
	if (!t || !t->fault_start)
		return 0;
	t->sig_start = t->fault_start;
	t->fault_start = 0;  /* not a fault that blocks, nor one a perf event closes */
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	struct fmt_tstat *t;
	__u64 now, d;
	__u32 tid;

	if (id != 15 /* rt_sigreturn on x86_64 */)
		return 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	t = bpf_map_lookup_elem(&tstats, &tid);
	if (!t || !t->sig_start)
		return 0;
	now = bpf_ktime_get_ns();
	d = now - t->sig_start;
	t->sig_start = 0;
	t->uffd_waits++;
	t->uffd_wait_ns += d;
	t->sig_faults++;
	t->fault_ns += d;
	t->lat_hist[log2_slot(d) & (FMT_LAT_SLOTS - 1)]++;
	return 0;
}

/* --- reclaim -------------------------------------------------------------------------- */

static __always_inline void reclaim_begin(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct fmt_tstat *t;

	if (!wanted(id >> 32))
		return;
	t = tstat_get(id >> 32, (__u32)id);
	if (t)
		t->reclaim_start = bpf_ktime_get_ns();
}

static __always_inline void reclaim_end(unsigned long nr)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	struct fmt_tstat *t;
	__u64 now, d;

	if (!wanted(pid))
		return;
	t = bpf_map_lookup_elem(&tstats, &(__u32){(__u32)id});
	if (!t || !t->reclaim_start)
		return;
	now = bpf_ktime_get_ns();
	d = now - t->reclaim_start;
	t->reclaim_start = 0;
	t->reclaims++;
	t->reclaim_ns += d;
	t->reclaimed += nr;
	if (targ_events & FMT_EV_RECLAIM)
		emit(FMT_RECLAIM, pid, (__u32)id, now, 0, nr, d);
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(on_memcg_begin, int order, gfp_t gfp)
{
	global_add(FMT_G_MEMCG_RECLAIM, 1);
	reclaim_begin();
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(on_memcg_end, unsigned long nr)
{
	reclaim_end(nr);
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(on_direct_begin, int order, gfp_t gfp)
{
	global_add(FMT_G_DIRECT_RECLAIM, 1);
	reclaim_begin();
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(on_direct_end, unsigned long nr)
{
	reclaim_end(nr);
	return 0;
}

SEC("tp_btf/mm_vmscan_kswapd_wake")
int BPF_PROG(on_kswapd_wake, int nid, int zid, int order)
{
	global_add(FMT_G_KSWAPD_WAKE, 1);
	return 0;
}

SEC("tp_btf/mm_vmscan_lru_shrink_inactive")
int BPF_PROG(on_shrink_inactive, int nid, unsigned long nr_scanned, unsigned long nr_reclaimed)
{
	global_add(FMT_G_SHRINK_RECLAIMED, nr_reclaimed);
	return 0;
}

/* --- HotSpot GC phases (hotspot:gc__begin(bool full) / gc__end(), no JVM flag needed) --- */

SEC("usdt")
int BPF_USDT(on_gc_begin, long full)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	struct fmt_gcstat *g, zero = {};
	__u64 now = bpf_ktime_get_ns();

	if (!wanted(pid))
		return 0;
	g = bpf_map_lookup_elem(&gcstats, &pid);
	if (!g) {
		bpf_map_update_elem(&gcstats, &pid, &zero, BPF_NOEXIST);
		g = bpf_map_lookup_elem(&gcstats, &pid);
		if (!g)
			return 0;
	}
	g->begins++;
	g->begin_ts = now;
	g->full = full & 1;
	if (targ_events & FMT_EV_GC)
		emit(FMT_GC_BEGIN, pid, (__u32)id, now, 0, full & 1, 0);
	return 0;
}

SEC("usdt")
int BPF_USDT(on_gc_end)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	struct fmt_gcstat *g;
	__u64 now = bpf_ktime_get_ns(), d = 0;

	if (!wanted(pid))
		return 0;
	g = bpf_map_lookup_elem(&gcstats, &pid);
	if (!g)
		return 0;
	g->ends++;
	if (g->begin_ts) {
		d = now - g->begin_ts;
		g->gc_ns += d;
		g->begin_ts = 0;
	}
	if (targ_events & FMT_EV_GC)
		emit(FMT_GC_END, pid, (__u32)id, now, 0, 0, d);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
