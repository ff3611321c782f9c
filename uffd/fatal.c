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
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fm_err("%s; stopping the program so that it never runs on with wrong memory", msg);
	_exit(70);
}
