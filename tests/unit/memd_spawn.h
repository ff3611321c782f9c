/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A private farmem-memd for C programs that drive the pager library: the unit
 * tests (tests/unit/unit.h) and bench/progs/move_remote.c. It dies with the
 * program that started it (PR_SET_PDEATHSIG): a failed test must not leave a
 * memd holding make's output pipe.
 */
#ifndef FARMEM_MEMD_SPAWN_H
#define FARMEM_MEMD_SPAWN_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define UNIT_MEMD_SECRET "unit-secret"

/*
 * The memd's pid once it said "ready", or -1. Run from the repository root
 * after make. With tcp, it also listens on 127.0.0.1 on a port the kernel
 * picks (no port that another test could hold): its log, in the file
 * "<sock>.log", names it, and tcp gets "tcp:127.0.0.1:PORT".
 */
static inline pid_t unit_start_memd_ex(const char *sock, const char *capacity, char *tcp, size_t tcplen)
{
	int pipefd[2];
	char fdarg[16], line[8] = { 0 }, logpath[256];
	pid_t parent = getpid(), pid;
	/* FARMEM_TEST_MEMD: another build (an older memd, say). */
	const char *bin = getenv("FARMEM_TEST_MEMD") ? getenv("FARMEM_TEST_MEMD") : "build/bin/farmem-memd";

	snprintf(logpath, sizeof(logpath), "%s.log", sock);
	if (pipe(pipefd))
		return -1;
	pid = fork();
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
			_exit(126);  /* the test is already gone */
		close(pipefd[0]);
		snprintf(fdarg, sizeof(fdarg), "%d", pipefd[1]);
		setenv("FARMEM_SECRET", UNIT_MEMD_SECRET, 1);
		if (tcp) {
			FILE *log = fopen(logpath, "w");
			if (!log || dup2(fileno(log), 2) < 0)
				_exit(125);
			execl(bin, "farmem-memd", "--unix", sock, "--capacity", capacity,
			      "--listen", "127.0.0.1:0", "--log", "info", "--ready-fd", fdarg, (char *)NULL);
		}
		execl(bin, "farmem-memd", "--unix", sock, "--capacity", capacity,
		      "--ready-fd", fdarg, (char *)NULL);
		_exit(127);
	}
	close(pipefd[1]);
	if (pid < 0 || read(pipefd[0], line, sizeof(line) - 1) != 6 || strcmp(line, "ready\n")) {
		fprintf(stderr, "memd did not start (run from the repository root after make)\n");
		close(pipefd[0]);
		return -1;
	}
	close(pipefd[0]);
	if (tcp) {
		char buf[512];
		FILE *log = fopen(logpath, "r");
		int port = 0;

		while (log && !port && fgets(buf, sizeof(buf), log)) {
			const char *at = strstr(buf, "listening on tcp:127.0.0.1:");
			if (at)
				port = atoi(at + strlen("listening on tcp:127.0.0.1:"));
		}
		if (log)
			fclose(log);
		if (port <= 0) {
			fprintf(stderr, "memd's log %s names no TCP port\n", logpath);
			kill(pid, SIGKILL);
			return -1;
		}
		snprintf(tcp, tcplen, "tcp:127.0.0.1:%d", port);
	}
	return pid;
}

static inline pid_t unit_start_memd(const char *sock, const char *capacity)
{
	return unit_start_memd_ex(sock, capacity, NULL, 0);
}

/*
 * Once its memd is gone: its socket (a memd killed by SIGKILL leaves it) and
 * its log, so that a run of the tests leaves nothing in /tmp.
 */
static inline void unit_memd_files_remove(const char *sock)
{
	char logpath[256];

	snprintf(logpath, sizeof(logpath), "%s.log", sock);
	unlink(sock);
	unlink(logpath);
}

/*
 * SIGSTOP to a memd this program started, returning once it has stopped:
 * until each of its threads has seen the signal (a loaded machine takes its
 * time), a worker that has not goes on serving. 0, or -1 if it did not stop.
 */
static inline int unit_stop_memd(pid_t pid)
{
	int st;
	pid_t got;

	if (kill(pid, SIGSTOP))
		return -1;
	while ((got = waitpid(pid, &st, WUNTRACED)) < 0 && errno == EINTR)
		;
	return got == pid && WIFSTOPPED(st) ? 0 : -1;
}

/*
 * Two memds listening on TCP, of capacities cap0 and cap1, their sockets
 * named after tag and this pid (the second's is the first's with ".2");
 * pid[0], pid[1] and "tcp:A,tcp:B" in two, for a transport over both. -1 if
 * either did not start.
 */
struct unit_two_memds {
	pid_t pid[2];
	char sock[2][80];
	char tcp[2][64];
	char two[160];
};

static inline int unit_start_two_memds(struct unit_two_memds *m, const char *tag, const char *cap0,
					const char *cap1)
{
	snprintf(m->sock[0], sizeof(m->sock[0]), "/tmp/farmem-unit-%s-%d.sock", tag, getpid());
	snprintf(m->sock[1], sizeof(m->sock[1]), "%.70s.2", m->sock[0]);
	for (int i = 0; i < 2; i++) {
		m->pid[i] = unit_start_memd_ex(m->sock[i], i ? cap1 : cap0, m->tcp[i], sizeof(m->tcp[i]));
		if (m->pid[i] < 0)
			return -1;
	}
	snprintf(m->two, sizeof(m->two), "%s,%s", m->tcp[0], m->tcp[1]);
	return 0;
}

#endif /* FARMEM_MEMD_SPAWN_H */
