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

/* fd is farmem's from now on (a number past the table is not kept). */
void fm_fd_own(int fd);
/* fd is about to be closed by farmem. */
void fm_fd_disown(int fd);
/*
 * 1 if fd is farmem's. A number once farmem's but closed without
 * fm_fd_disown is told apart by its file (device and inode), so a
 * forgotten disown never keeps the program from its own descriptor.
 */
int fm_fd_owned(int fd);
/* Close fd, farmem's own: fm_fd_disown, then close. */
int fm_fd_close(int fd);

#endif
