/* resp.h: internal helpers shared by pipeline.c and bulk.c: growable buffers,
 * RESP framing into an output buffer, the I/O of a batch (writing framed bytes,
 * taking replies as they arrive) and flattening hiredis replies into the
 * emq_replies layout of emq.h. Not part of the cffi interface. */
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

/* ---- framing: RESP commands into an output buffer ------------------------ */

/* Bytes framed ahead of the socket: p[0, len) framed, p[0, off) already written. */
typedef struct {
    char *p;
    size_t len, cap, off;
} emq_wbuf;

/* Append "*<nargs>\r\n" then `prefix` (leading arguments framed already).
 * 0 on success, -1 on no memory (as every framing call). */
int emq_frame_head(emq_wbuf *w, uint64_t nargs, const char *prefix, size_t prefixlen);

/* Append one bulk string made of two pieces, a then b (either may be empty). */
int emq_frame_bulk2(emq_wbuf *w, const char *a, size_t alen, const char *b, size_t blen);

/* Append the three leading arguments of every call: EVALSHA <sha> <numkeys>. */
int emq_frame_evalsha(emq_wbuf *w, const char *sha, size_t shalen, int64_t numkeys);

/* ---- a batch's I/O over one emq_conn ------------------------------------- */

/* Start a batch of n calls: out emptied, room for n integer replies. EMQ_OK,
 * EMQ_EUNSENT (not connected, or not usable: see emq_conn_usable; then closed) or
 * EMQ_ENOMEM; nothing sent either way. */
int emq_batch_begin(emq_conn *c, emq_replies *out, size_t n);

/* One send() of w's unwritten bytes; *sent counts the bytes that left. 0, or -1
 * on a failure (errno set). An interrupted send is no failure, nor, with
 * `dontwait`, a full socket buffer: both leave the bytes for the next call. */
int emq_batch_send(emq_conn *c, emq_wbuf *w, int dontwait, size_t *sent);

/* Move every reply hiredis has parsed so far into out; a reply past the
 * `expected` calls sent is a protocol failure. EMQ_OK, or the batch's failure
 * code (the connection is closed then). */
int emq_batch_take_replies(emq_conn *c, emq_replies *out, size_t expected, size_t sent);

/* Fail the batch: "<what>: <cause>" recorded and the connection closed, since
 * unread replies or a half-written command would desynchronise it. Returns
 * EMQ_EIO once any byte left (`sent`), else EMQ_EUNSENT (safe to retry). */
int emq_batch_fail(emq_conn *c, const char *what, int saved_errno, size_t sent);

#endif
