/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file descriptors farmem keeps open inside a program's process (its
 * userfaultfds, memd connections, residency map, eventfds, pipes). A program
 * that closes every descriptor it did not open itself (a daemon's loop up to
 * the limit, closefrom, close_range) would close them under the pager, and a
 * number it then reuses would carry the pager's traffic into the program's
 * file. The shim's covers of close, close_range and closefrom skip them.
 */
#ifndef FARMEM_FDS_H
#define FARMEM_FDS_H

/* Numbers from FM_FDS_MAX on are not kept (fm_fd_keep puts farmem's far below it). */
#define FM_FDS_MAX 4096

/* fd is farmem's from now on. */
void fm_fd_own(int fd);
/*
 * fd, just opened, moved up out of the numbers programs pick themselves
 * (a script's `exec 4>file` is a dup2 onto 4), then owned: returns the
 * number to use from now on (fd itself if it cannot be moved).
 */
int fm_fd_keep(int fd);
/*
 * Grow the process's descriptor table to hold the numbers fm_fd_keep picks,
 * now, while one thread runs. Grown later, with threads sharing the table,
 * the kernel waits out an RCU grace period first (14-29 ms here: most of
 * what the JVM agent added to a JVM's start). A table survives exec, so a
 * program this process execs starts with it too. Best effort: with fds 0
 * to 2 closed it does nothing.
 */
void fm_fds_widen(void);
/* fd is about to be closed by farmem. */
void fm_fd_disown(int fd);
/*
 * 1 if fd is farmem's. A number once farmem's but closed without
 * fm_fd_disown is told apart by its file (device and inode), so a
 * forgotten disown never keeps the program from its own descriptor.
 */
int fm_fd_owned(int fd);
/*
 * Close fd, farmem's own, if it still is: one the program replaced (dup2
 * onto it) is the program's now and stays open. 0, or -1 with EBADF.
 */
int fm_fd_close(int fd);

#endif
