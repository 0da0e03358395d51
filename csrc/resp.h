/* resp.h: internal helpers shared by pipeline.c and bulk.c: growable buffers,
 * RESP framing, and flattening hiredis replies into the emq_replies layout of
 * emq.h. Not part of the cffi interface. */
#ifndef EMQ_RESP_H
#define EMQ_RESP_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "emq.h"

/* Worst case for "*<n>\r\n" or "$<n>\r\n". */
#define EMQ_HEADER_MAX 24

/* Make room for `need` more elements of `size` bytes after `used` ones in *ptr
 * (capacity *cap, in elements). 0 on success, -1 on overflow or no memory. */
int emq_reserve(void **ptr, size_t *cap, size_t used, size_t need, size_t size);

/* Decimal digits of v at p; returns the end. */
char *emq_put_uint(char *p, uint64_t v);

/* "<kind><n>\r\n" at p (kind '*' or '$'); returns the end. */
char *emq_put_header(char *p, char kind, uint64_t n);

/* Empty r for a new batch, keeping its buffers. */
void emq_replies_reset(emq_replies *r);

/* Append reply x (recursively) to r's nodes/data. 0 on success, -1 on no memory. */
int emq_flatten(emq_replies *r, const redisReply *x);

#endif
