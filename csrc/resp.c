/* resp.c: growable buffers, RESP framing, a batch's I/O and reply flattening
 * shared by the pipelined (pipeline.c) and streamed (bulk.c) batches. */
#define EMQ_INTERNAL
#include "resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#ifndef MSG_NOSIGNAL /* macOS: Python ignores SIGPIPE anyway */
#define MSG_NOSIGNAL 0
#endif

int emq_reserve(void **ptr, size_t *cap, size_t used, size_t need, size_t size)
{
    if (used + need <= *cap)
        return 0;
    if (need > SIZE_MAX / size - used) /* used + need elements would not fit size_t */
        return -1;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < used + need)
        ncap = ncap > SIZE_MAX / 2 / size ? used + need : ncap * 2;
    void *np = realloc(*ptr, ncap * size);
    if (np == NULL)
        return -1;
    *ptr = np;
    *cap = ncap;
    return 0;
}

char *emq_put_uint(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

char *emq_put_header(char *p, char kind, uint64_t n)
{
    *p++ = kind;
    p = emq_put_uint(p, n);
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

void emq_replies_reset(emq_replies *r)
{
    r->nreplies = 0;
    r->nsent = 0;
    r->all_int = 1;
    r->nnodes = 0;
    r->datalen = 0;
}

void emq_replies_free(emq_replies *r)
{
    free(r->ints);
    free(r->nodes);
    free(r->data);
    memset(r, 0, sizeof *r);
}

static int add_node(emq_replies *r, int64_t type, int64_t a, int64_t b)
{
    if (emq_reserve((void **)&r->nodes, &r->nodes_cap, r->nnodes * 3, 3, sizeof(int64_t)))
        return -1;
    int64_t *n = r->nodes + r->nnodes * 3;
    n[0] = type;
    n[1] = a;
    n[2] = b;
    r->nnodes++;
    return 0;
}

static int add_string(emq_replies *r, int64_t type, const char *s, size_t len)
{
    if (emq_reserve((void **)&r->data, &r->data_cap, r->datalen, len, 1))
        return -1;
    if (len)
        memcpy(r->data + r->datalen, s, len);
    int rc = add_node(r, type, (int64_t)r->datalen, (int64_t)len);
    r->datalen += len;
    return rc;
}

int emq_flatten(emq_replies *r, const redisReply *x)
{
    switch (x->type) {
    case REDIS_REPLY_INTEGER:
        return add_node(r, EMQ_R_INT, x->integer, 0);
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
#ifdef REDIS_REPLY_VERB
    case REDIS_REPLY_VERB:
#endif
        return add_string(r, EMQ_R_BYTES, x->str, x->len);
    case REDIS_REPLY_ERROR:
        return add_string(r, EMQ_R_ERROR, x->str, x->len);
    case REDIS_REPLY_NIL:
        return add_node(r, EMQ_R_NIL, 0, 0);
#ifdef REDIS_REPLY_BOOL
    case REDIS_REPLY_BOOL:
        return add_node(r, EMQ_R_INT, x->integer, 0);
#endif
#ifdef REDIS_REPLY_DOUBLE /* hiredis >= 1.0 keeps the server's text in str */
    case REDIS_REPLY_DOUBLE:
        return add_string(r, EMQ_R_DOUBLE, x->str, x->len);
#endif
#ifdef REDIS_REPLY_BIGNUM
    case REDIS_REPLY_BIGNUM:
        return add_string(r, EMQ_R_BIGNUM, x->str, x->len);
#endif
    case REDIS_REPLY_ARRAY:
#ifdef REDIS_REPLY_MAP /* RESP3 aggregates become flat arrays */
    case REDIS_REPLY_MAP:
    case REDIS_REPLY_SET:
#endif
#ifdef REDIS_REPLY_PUSH
    case REDIS_REPLY_PUSH:
#endif
#ifdef REDIS_REPLY_ATTR
    case REDIS_REPLY_ATTR:
#endif
        if (add_node(r, EMQ_R_ARRAY, (int64_t)x->elements, 0))
            return -1;
        for (size_t i = 0; i < x->elements; i++)
            if (emq_flatten(r, x->element[i]))
                return -1;
        return 0;
    default: {
        static const char msg[] = "EMQ unsupported reply type";
        return add_string(r, EMQ_R_ERROR, msg, sizeof msg - 1);
    }
    }
}

/* ---- framing ------------------------------------------------------------- */

int emq_frame_head(emq_wbuf *w, uint64_t nargs, const char *prefix, size_t prefixlen)
{
    if (emq_reserve((void **)&w->p, &w->cap, w->len, EMQ_HEADER_MAX + prefixlen, 1))
        return -1;
    char *p = emq_put_header(w->p + w->len, '*', nargs);
    if (prefixlen)
        memcpy(p, prefix, prefixlen);
    w->len = (size_t)(p - w->p) + prefixlen;
    return 0;
}

int emq_frame_bulk2(emq_wbuf *w, const char *a, size_t alen, const char *b, size_t blen)
{
    if (emq_reserve((void **)&w->p, &w->cap, w->len, alen + blen + EMQ_HEADER_MAX + 2, 1))
        return -1;
    char *p = emq_put_header(w->p + w->len, '$', alen + blen);
    if (alen)
        memcpy(p, a, alen);
    p += alen;
    if (blen)
        memcpy(p, b, blen);
    p += blen;
    *p++ = '\r';
    *p++ = '\n';
    w->len = (size_t)(p - w->p);
    return 0;
}

int emq_frame_evalsha(emq_wbuf *w, const char *sha, size_t shalen, int64_t numkeys)
{
    char num[24];
    char *end = numkeys < 0 ? (num[0] = '-', emq_put_uint(num + 1, (uint64_t)0 - (uint64_t)numkeys))
                            : emq_put_uint(num, (uint64_t)numkeys);
    if (emq_frame_bulk2(w, "EVALSHA", 7, NULL, 0) || emq_frame_bulk2(w, sha, shalen, NULL, 0)
        || emq_frame_bulk2(w, num, (size_t)(end - num), NULL, 0))
        return -1;
    return 0;
}

/* ---- a batch's I/O ------------------------------------------------------- */

int emq_batch_begin(emq_conn *c, emq_replies *out, size_t n)
{
    emq_replies_reset(out);
    if (c->ctx == NULL) {
        if (c->err[0] == '\0')
            strcpy(c->err, "not connected");
        return EMQ_EUNSENT;
    }
    /* Checked here, not by a call of its own: the caller drops the GIL once per batch. */
    if (!emq_conn_usable(c))
        return emq_batch_fail(c, "connection found closed or out of step before sending",
                              0, 0);
    if (emq_reserve((void **)&out->ints, &out->ints_cap, 0, n ? n : 1, sizeof(int64_t)))
        return EMQ_ENOMEM;
    return EMQ_OK;
}

int emq_batch_send(emq_conn *c, emq_wbuf *w, int dontwait, size_t *sent)
{
    ssize_t n = emq_conn_send(c, w->p + w->off, w->len - w->off, dontwait);
    if (n < 0) {
        int full = dontwait && (errno == EAGAIN || errno == EWOULDBLOCK);
        return errno == EINTR || full ? 0 : -1;
    }
    w->off += (size_t)n;
    *sent += (size_t)n;
    return 0;
}

int emq_batch_fail(emq_conn *c, const char *what, int saved_errno, size_t sent)
{
    emq_conn_fail(c, what, saved_errno);
    return sent ? EMQ_EIO : EMQ_EUNSENT;
}

/* Store one top-level reply (and free it). 0, or -1 on no memory. */
static int take_reply(emq_replies *out, void *reply)
{
    const redisReply *x = reply;
    int is_int = x->type == REDIS_REPLY_INTEGER;
    out->ints[out->nreplies] = is_int ? x->integer : 0;
    out->all_int &= is_int;
    int bad = emq_flatten(out, x);
    freeReplyObject(reply);
    out->nreplies++;
    return bad;
}

int emq_batch_take_replies(emq_conn *c, emq_replies *out, size_t expected, size_t sent)
{
    for (;;) {
        void *reply = NULL;
        if (redisGetReplyFromReader(c->ctx, &reply) != REDIS_OK)
            return emq_batch_fail(c, "parse reply from redis", EPROTO, sent);
        if (reply == NULL)
            return EMQ_OK;
        if (out->nreplies >= expected) { /* a reply to nothing we sent */
            freeReplyObject(reply);
            return emq_batch_fail(c, "unexpected reply from redis", EPROTO, sent);
        }
        if (take_reply(out, reply)) {
            emq_conn_close(c); /* replies still in flight */
            strcpy(c->err, "out of memory while reading replies");
            return EMQ_ENOMEM;
        }
    }
}
