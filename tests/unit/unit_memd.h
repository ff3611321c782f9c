/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A private farmem-memd for a unit test, on a Unix socket, with the unit
 * secret. It dies with the test (PR_SET_PDEATHSIG): a test that fails or is
 * killed must not leave a memd behind holding its output pipe.
 */
#ifndef FARMEM_UNIT_MEMD_H
#define FARMEM_UNIT_MEMD_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

/* The memd's pid once it said "ready", or -1. Run from the repository root after make. */
static pid_t unit_start_memd(const char *sock, const char *capacity)
{
	int pipefd[2];
	char fdarg[16], line[8] = { 0 };
	pid_t parent = getpid(), pid;

	if (pipe(pipefd))
		return -1;
	pid = fork();
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
			_exit(126);  /* the test is already gone */
		close(pipefd[0]);
		snprintf(fdarg, sizeof(fdarg), "%d", pipefd[1]);
		setenv("FARMEM_SECRET", "unit-secret", 1);
		execl("build/bin/farmem-memd", "farmem-memd", "--unix", sock, "--capacity", capacity,
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
	return pid;
}

#endif /* FARMEM_UNIT_MEMD_H */
