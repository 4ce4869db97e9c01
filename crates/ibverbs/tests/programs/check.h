/*
 * What every test program here fails with: die() prints "FAIL: " and the message on
 * stderr and exits with status 1; CHECK(cond, fmt, ...) dies unless cond holds.
 */
#ifndef SOFTRDMA_TEST_CHECK_H
#define SOFTRDMA_TEST_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define CHECK(cond, ...) do { if (!(cond)) die(__VA_ARGS__); } while (0)

#endif
