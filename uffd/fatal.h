/* SPDX-License-Identifier: Apache-2.0 */
#ifndef FARMEM_FATAL_H
#define FARMEM_FATAL_H

/*
 * The pager cannot keep its promise about a page (memd lost it, the kernel
 * refused an install): print why and end the process with status 70, so
 * that the program never runs on with wrong memory. Async-signal-safe.
 */
void fm_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
