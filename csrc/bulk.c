/* bulk.c - one script over many calls given as columns, framed here and
 * streamed: the bulk-enqueue path.
 *
 * A bulk enqueue sends the same script 100k times with mostly the same
 * arguments: only the job key, id, payload and encoding differ per call.
 * Building a flat Python list of every argument costs the client more than
 * the server spends running the script, so the caller passes each constant
 * argument once and one column per varying argument, and the RESP of every
 * call is framed here.
 *
 * The batch is written and its replies read at the same time (poll), so the
 * server always has the next calls queued instead of idling while the client
 * frames a chunk or drains replies. Replies land in emq_replies exactly as
 * emq_evalsha_batch leaves them.
 */
#define EMQ_INTERNAL
#include "emq.h"
#include "resp.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#ifndef MSG_NOSIGNAL /* macOS: Python ignores SIGPIPE anyway */
#define MSG_NOSIGNAL 0
#endif

/* Frame about this much before writing it: big enough for few syscalls,
 * small enough that the server starts on the first calls at once. */
#define FRAME_BYTES ((size_t)256 << 10)

typedef struct {
    char *p;
    size_t len, cap, off; /* off: bytes of p already written */
} wbuf_t;

/* Append "$<a+b>\r\n" a b "\r\n" (a bulk string made of two pieces). */
static int put_bulk2(wbuf_t *w, const char *a, size_t alen, const char *b, size_t blen)
{
    if (emq_reserve((void **)&w->p, &w->cap, 0, w->len + alen + blen + EMQ_HEADER_MAX + 2, 1))
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

/* ---- the streamed batch --------------------------------------------------- */

typedef struct {
    size_t ncalls, nslots, ncols;
    const char *const *slot_ptr; /* constant part of each slot */
    const size_t *slot_lens;
    const int64_t *slot_col;     /* column appended to the slot, or -1 */
    const size_t *col_lens;      /* ncols * ncalls lengths, column-major */
    const char **col_cur;        /* read position in each column */
    const char *pre;             /* "*<n>\r\n$7\r\nEVALSHA\r\n$40\r\n<sha>\r\n$<k>\r\n<k>\r\n" */
    size_t prelen;
} frame_t;

/* Frame calls [*next, ...) into w until it holds about FRAME_BYTES. */
static int frame_more(frame_t *f, size_t *next, wbuf_t *w)
{
    while (*next < f->ncalls && w->len - w->off < FRAME_BYTES) {
        size_t i = *next;
        if (emq_reserve((void **)&w->p, &w->cap, 0, w->len + f->prelen, 1))
            return -1;
        memcpy(w->p + w->len, f->pre, f->prelen);
        w->len += f->prelen;
        for (size_t s = 0; s < f->nslots; s++) {
            const char *v = NULL;
            size_t vlen = 0;
            int64_t col = f->slot_col[s];
            if (col >= 0) { /* a column may feed several slots: same value in each */
                v = f->col_cur[col];
                vlen = f->col_lens[(size_t)col * f->ncalls + i];
            }
            if (put_bulk2(w, f->slot_ptr[s], f->slot_lens[s], v, vlen))
                return -1;
        }
        for (size_t k = 0; k < f->ncols; k++) /* on to call i + 1 */
            f->col_cur[k] += f->col_lens[k * f->ncalls + i];
        (*next)++;
    }
    return 0;
}

static int io_timeout_ms(int fd)
{
    struct timeval tv;
    socklen_t len = sizeof tv;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0))
        return -1; /* no timeout configured: wait as long as it takes */
    long ms = (long)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    return ms > 0 ? (int)ms : 1;
}

static int stream_fail(emq_conn *c, const char *what, int saved_errno, size_t sent, wbuf_t *w)
{
    free(w->p);
    emq_conn_fail(c, what, saved_errno); /* unread replies: the connection is closed */
    return sent ? EMQ_EIO : EMQ_EUNSENT;
}

int emq_evalsha_columns(emq_conn *c, const char *sha, size_t shalen, int64_t numkeys,
                        size_t ncalls, size_t nslots, const char *slot_data,
                        const size_t *slot_lens, const int64_t *slot_col, size_t ncols,
                        const char *col_data, const size_t *col_lens, emq_replies *out)
{
    emq_replies_reset(out);
    if (ncalls == 0)
        return EMQ_OK;
    for (size_t s = 0; s < nslots; s++)
        if (slot_col[s] >= (int64_t)ncols)
            return EMQ_EINVAL;
    if (c->ctx == NULL) {
        if (c->err[0] == '\0')
            strcpy(c->err, "not connected");
        return EMQ_EUNSENT;
    }
    if (emq_reserve((void **)&out->ints, &out->ints_cap, 0, ncalls, sizeof(int64_t)))
        return EMQ_ENOMEM;

    /* The leading arguments are the same for every call: frame them once. */
    if (shalen > 64)
        return EMQ_EINVAL;
    char pre[256];
    char num[24];
    int ndigits = snprintf(num, sizeof num, "%lld", (long long)numkeys);
    char *pe = emq_put_header(pre, '*', 3 + nslots);
    memcpy(pe, "$7\r\nEVALSHA\r\n", 13);
    pe += 13;
    pe = emq_put_header(pe, '$', shalen);
    memcpy(pe, sha, shalen);
    pe += shalen;
    *pe++ = '\r';
    *pe++ = '\n';
    pe = emq_put_header(pe, '$', (uint64_t)ndigits);
    memcpy(pe, num, (size_t)ndigits);
    pe += ndigits;
    *pe++ = '\r';
    *pe++ = '\n';

    const char **slot_ptr = malloc(sizeof(char *) * (nslots ? nslots : 1));
    const char **col_cur = malloc(sizeof(char *) * (ncols ? ncols : 1));
    if (slot_ptr == NULL || col_cur == NULL) {
        free(slot_ptr);
        free(col_cur);
        return EMQ_ENOMEM;
    }
    for (size_t s = 0, off = 0; s < nslots; s++) {
        slot_ptr[s] = slot_data + off;
        off += slot_lens[s];
    }
    for (size_t k = 0, off = 0; k < ncols; k++) {
        col_cur[k] = col_data + off;
        for (size_t i = 0; i < ncalls; i++)
            off += col_lens[k * ncalls + i];
    }
    frame_t f = {ncalls, nslots, ncols, slot_ptr, slot_lens, slot_col, col_lens, col_cur,
                 pre, (size_t)(pe - pre)};

    wbuf_t w = {NULL, 0, 0, 0};
    size_t next = 0, sent = 0;
    int fd = c->ctx->fd, rc = EMQ_OK;
    int timeout = io_timeout_ms(fd);

    while (out->nreplies < ncalls) {
        if (w.off == w.len) { /* everything framed so far is out: frame the next calls */
            w.len = w.off = 0;
            if (frame_more(&f, &next, &w)) {
                /* Calls already sent must still be answered before the connection is reusable. */
                free(w.p);
                free(slot_ptr);
                free(col_cur);
                if (sent) {
                    emq_conn_fail(c, "out of memory while framing", ENOMEM);
                    return EMQ_EIO;
                }
                strcpy(c->err, "out of memory while framing commands");
                return EMQ_ENOMEM;
            }
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (w.off < w.len)
            p.events |= POLLOUT;
        int ready = poll(&p, 1, timeout);
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            rc = stream_fail(c, "poll", errno, sent, &w);
            goto done;
        }
        if (ready == 0) {
            rc = stream_fail(c, "timed out talking to redis", ETIMEDOUT, sent, &w);
            goto done;
        }
        if ((p.revents & POLLOUT) && w.off < w.len) {
            ssize_t n = send(fd, w.p + w.off, w.len - w.off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                rc = stream_fail(c, "write to redis", errno, sent, &w);
                goto done;
            }
            if (n > 0) {
                w.off += (size_t)n;
                sent += (size_t)n;
                out->nsent = next; /* every call framed so far may have left, in part */
            }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            if (redisBufferRead(c->ctx) != REDIS_OK) {
                rc = stream_fail(c, "read from redis", errno, sent, &w);
                goto done;
            }
            for (;;) {
                void *reply = NULL;
                if (redisGetReplyFromReader(c->ctx, &reply) != REDIS_OK) {
                    rc = stream_fail(c, "parse reply from redis", EPROTO, sent, &w);
                    goto done;
                }
                if (reply == NULL)
                    break;
                if (out->nreplies >= next) { /* a reply to nothing we sent */
                    freeReplyObject(reply);
                    rc = stream_fail(c, "unexpected reply from redis", EPROTO, sent, &w);
                    goto done;
                }
                const redisReply *x = reply;
                int is_int = x->type == REDIS_REPLY_INTEGER;
                out->ints[out->nreplies] = is_int ? x->integer : 0;
                out->all_int &= is_int;
                int bad = emq_flatten(out, x);
                freeReplyObject(reply);
                out->nreplies++;
                if (bad) {
                    free(w.p);
                    emq_conn_close(c); /* replies still in flight */
                    strcpy(c->err, "out of memory while reading replies");
                    rc = EMQ_ENOMEM;
                    goto done;
                }
            }
        }
    }
    free(w.p);
done:
    free(slot_ptr);
    free(col_cur);
    return rc;
}
