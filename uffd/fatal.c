// SPDX-License-Identifier: Apache-2.0
#include "fatal.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "fm_util.h"

void fm_fatal(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	fm_vfmt(msg, sizeof(msg), fmt, ap); /* no locale, no allocation: it may run in a fault handler */
	va_end(ap);
	fm_err("%s; stopping the program so that it never runs on with wrong memory", msg);
	_exit(70);
}
