// SPDX-License-Identifier: Apache-2.0
/*
 * A stream connection polls for memd's reply before it sleeps (fm_conn's
 * spin_ns), and stops polling for the next FM_CONN_SPIN_SKIP replies once a
 * poll has run out: a memd that answers slowly (a network away, or, here,
 * stopped for a while) costs one poll now and then, not one per call. Every
 * call still gets its own reply, polled for or slept on, and a connection
 * that does not poll (spin_ns 0) never counts anything.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../memd/client/conn.h"
#include "fm_util.h"
#include "unit.h"

#define STOP_MS   30  /* memd stopped this long: far past a poll of 200 us */

static pid_t memd_pid;
static pid_t caller_tid;  /* the thread whose call waits on the stopped memd */

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* Whether the calling thread sleeps in poll(2): its poll for the reply has run out. */
static int caller_sleeps_in_poll(void)
{
	char path[64];
	long nr = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)caller_tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%ld", &nr) != 1)  /* "running" while it runs */
		nr = -1;
	fclose(f);
	return nr == SYS_poll || nr == SYS_ppoll;
}

/*
 * memd resumes STOP_MS after it stopped, and not before the caller sleeps
 * in poll: a caller held off the CPU before it sent its request (a loaded
 * CI machine) would otherwise find the reply at once and never poll out.
 */
static void *resume_later(void *arg)
{
	(void)arg;
	sleep_ms(STOP_MS);
	for (uint64_t give_up = fm_now_ns() + 3000000000ull; !caller_sleeps_in_poll() && fm_now_ns() < give_up;)
		sleep_ms(1);
	kill(memd_pid, SIGCONT);
	return NULL;
}

/* STATS, and whether its reply is one: a well-formed memd_stats of the size asked for. */
static int stats_call(struct fm_conn *c)
{
	struct fm_stats s;
	size_t len = 0;
	uint16_t st = 0xffff;
	int rc = fm_conn_call(c, FM_OP_STATS, 0, NULL, 0, &s, sizeof(s), &len, &st, NULL, fm_deadline_in(5000));

	return rc == 0 && st == 0 && len == sizeof(s) ? 0 : -1;
}

/* One call with memd stopped for STOP_MS: the reply comes after it resumes. Its time in ms. */
static uint64_t slow_call(struct fm_conn *c, int *ok)
{
	pthread_t th;
	uint64_t t0 = fm_now_ns();

	caller_tid = (pid_t)syscall(SYS_gettid);
	if (unit_stop_memd(memd_pid)) {
		*ok = 0;
		return 0;
	}
	pthread_create(&th, NULL, resume_later, NULL);
	*ok = stats_call(c) == 0;
	pthread_join(th, NULL);
	return (fm_now_ns() - t0) / 1000000;
}

int main(void)
{
	const char *sock = "/tmp/fm-unit-conn-spin.sock";
	struct fm_peer peer;
	struct fm_conn c;
	char err[256] = "";
	int ok;

	memd_pid = unit_start_memd_ex(sock, "16M", NULL, 0);
	if (memd_pid < 0)
		return 1;
	if (fm_peer_resolve(&peer, "unix:/tmp/fm-unit-conn-spin.sock", UNIT_MEMD_SECRET, strlen(UNIT_MEMD_SECRET),
			    err, sizeof(err)) ||
	    fm_conn_open(&c, &peer, fm_deadline_in(5000), err, sizeof(err))) {
		fprintf(stderr, "test_conn_spin: cannot connect: %s\n", err);
		return 1;
	}

	/* Polling: every reply arrives, whether the poll or the sleep after it gets it. */
	c.spin_ns = 200000;
	for (int i = 0; i < 200; i++)
		CHECK(stats_call(&c) == 0);

	/* A reply that outlasts the poll: the next FM_CONN_SPIN_SKIP are slept on, then polling again. */
	c.spin_skip = 0;
	CHECK(slow_call(&c, &ok) >= STOP_MS);
	CHECK(ok);
	CHECK(c.spin_skip == FM_CONN_SPIN_SKIP);
	for (int i = 0; i < FM_CONN_SPIN_SKIP; i++)
		CHECK(stats_call(&c) == 0);
	CHECK(c.spin_skip == 0);

	/* A slow reply while the skip runs: it was not polled for, so it starts no new skip. */
	CHECK(slow_call(&c, &ok) >= STOP_MS); /* polled for: skip starts */
	CHECK(ok && c.spin_skip == FM_CONN_SPIN_SKIP);
	CHECK(slow_call(&c, &ok) >= STOP_MS); /* slept on at once */
	CHECK(ok && c.spin_skip == FM_CONN_SPIN_SKIP - 1);

	/* No polling: a slow reply is slept on and nothing is counted. */
	c.spin_ns = 0;
	c.spin_skip = 0;
	CHECK(slow_call(&c, &ok) >= STOP_MS);
	CHECK(ok && c.spin_skip == 0);

	fm_conn_close(&c);
	kill(memd_pid, SIGKILL);
	waitpid(memd_pid, NULL, 0);
	unit_memd_files_remove(sock);
	if (failures) {
		fprintf(stderr, "test_conn_spin: %d check(s) failed\n", failures);
		return 1;
	}
	printf("test_conn_spin: ok\n");
	return 0;
}
