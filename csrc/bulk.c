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
 * emq_evalsha_batch leaves them. Framing and the batch's I/O are resp.c's
 * helpers, shared with pipeline.c.
 */
#define EMQ_INTERNAL
#include "emq.h"
#include "resp.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

/* Frame about this much before writing it: big enough for few syscalls,
 * small enough that the server starts on the first calls at once. */
#define FRAME_BYTES ((size_t)256 << 10)

/* ---- the calls, as columns ------------------------------------------------ */

typedef struct {
    size_t ncalls, nslots, ncols;
    const char **slot_ptr;       /* constant part of each slot */
    const size_t *slot_lens;
    const int64_t *slot_col;     /* column appended to the slot, or -1 */
    const size_t *col_lens;      /* ncols * ncalls lengths, column-major */
    const char **col_cur;        /* read position in each column */
    const char *pre;             /* "$7\r\nEVALSHA\r\n$40\r\n<sha>\r\n$<k>\r\n<k>\r\n" */
    size_t prelen;
    size_t next;                 /* next call to frame */
} frame_t;

/* Point each slot at its constant bytes and each column at its first value.
 * 0, or -1 on no memory (nothing to free then). */
static int columns_open(frame_t *f, const char *slot_data, const char *col_data)
{
    f->slot_ptr = malloc(sizeof(char *) * (f->nslots ? f->nslots : 1));
    f->col_cur = malloc(sizeof(char *) * (f->ncols ? f->ncols : 1));
    if (f->slot_ptr == NULL || f->col_cur == NULL) {
        free(f->slot_ptr);
        free(f->col_cur);
        return -1;
    }
    for (size_t s = 0, off = 0; s < f->nslots; s++) {
        f->slot_ptr[s] = slot_data + off;
        off += f->slot_lens[s];
    }
    for (size_t k = 0, off = 0; k < f->ncols; k++) {
        f->col_cur[k] = col_data + off;
        for (size_t i = 0; i < f->ncalls; i++)
            off += f->col_lens[k * f->ncalls + i];
    }
    return 0;
}

static void columns_close(frame_t *f)
{
    free(f->slot_ptr);
    free(f->col_cur);
}

/* Frame call f->next into w and step every column on to the next call. */
static int frame_call(frame_t *f, emq_wbuf *w)
{
    size_t i = f->next;
    if (emq_frame_head(w, 3 + f->nslots, f->pre, f->prelen))
        return -1;
    for (size_t s = 0; s < f->nslots; s++) {
        const char *v = NULL;
        size_t vlen = 0;
        int64_t col = f->slot_col[s];
        if (col >= 0) { /* a column may feed several slots: same value in each */
            v = f->col_cur[col];
            vlen = f->col_lens[(size_t)col * f->ncalls + i];
        }
        if (emq_frame_bulk2(w, f->slot_ptr[s], f->slot_lens[s], v, vlen))
            return -1;
    }
    for (size_t k = 0; k < f->ncols; k++)
        f->col_cur[k] += f->col_lens[k * f->ncalls + i];
    f->next++;
    return 0;
}

/* Frame the next calls into w (emptied first: all of it was written) until it
 * holds about FRAME_BYTES. */
static int frame_more(frame_t *f, emq_wbuf *w)
{
    w->len = w->off = 0;
    while (f->next < f->ncalls && w->len < FRAME_BYTES)
        if (frame_call(f, w))
            return -1;
    return 0;
}

/* ---- the stream ------------------------------------------------------------ */

static int io_timeout_ms(int fd)
{
    struct timeval tv;
    socklen_t len = sizeof tv;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) != 0
        || (tv.tv_sec == 0 && tv.tv_usec == 0))
        return -1; /* no timeout configured: wait as long as it takes */
    long ms = (long)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    return ms > 0 ? (int)ms : 1;
}

/* Out of memory while framing: calls already sent must still be answered
 * before the connection is reusable, so then it is closed. */
static int framing_failed(emq_conn *c, size_t sent)
{
    if (sent) {
        emq_conn_fail(c, "out of memory while framing", ENOMEM);
        return EMQ_EIO;
    }
    strcpy(c->err, "out of memory while framing commands");
    return EMQ_ENOMEM;
}

/* One wait on the socket: write what it takes of w, then take the replies that
 * arrived. `framed`: calls framed so far (those any written byte may belong to). */
static int stream_step(emq_conn *c, emq_wbuf *w, size_t framed, int timeout, size_t *sent,
                       emq_replies *out)
{
    struct pollfd p = {c->ctx->fd, POLLIN, 0};
    if (w->off < w->len)
        p.events |= POLLOUT;
    int ready = poll(&p, 1, timeout);
    if (ready < 0)
        return errno == EINTR ? EMQ_OK : emq_batch_fail(c, "poll", errno, *sent);
    if (ready == 0)
        return emq_batch_fail(c, "timed out talking to redis", ETIMEDOUT, *sent);
    if ((p.revents & POLLOUT) && w->off < w->len) {
        size_t before = *sent;
        if (emq_batch_send(c, w, 1, sent))
            return emq_batch_fail(c, "write to redis", errno, *sent);
        if (*sent > before)
            out->nsent = framed; /* every call framed so far may have left, in part */
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        if (redisBufferRead(c->ctx) != REDIS_OK)
            return emq_batch_fail(c, "read from redis", errno, *sent);
        return emq_batch_take_replies(c, out, framed, *sent);
    }
    return EMQ_OK;
}

/* Write every call of f while reading the replies, until all are answered. */
static int stream_calls(emq_conn *c, frame_t *f, emq_replies *out)
{
    emq_wbuf w = {NULL, 0, 0, 0};
    size_t sent = 0;
    int timeout = io_timeout_ms(c->ctx->fd), rc = EMQ_OK;
    while (rc == EMQ_OK && out->nreplies < f->ncalls) {
        if (w.off == w.len && frame_more(f, &w)) /* all out: frame the next calls */
            rc = framing_failed(c, sent);
        else
            rc = stream_step(c, &w, f->next, timeout, &sent, out);
    }
    free(w.p);
    return rc;
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
    int rc = emq_batch_begin(c, out, ncalls);
    if (rc != EMQ_OK)
        return rc;
    if (shalen > 64)
        return EMQ_EINVAL;

    /* The leading arguments are the same for every call: frame them once. */
    emq_wbuf pre = {NULL, 0, 0, 0};
    frame_t f = {ncalls, nslots, ncols, NULL, slot_lens, slot_col, col_lens, NULL, NULL, 0, 0};
    if (emq_frame_evalsha(&pre, sha, shalen, numkeys) || columns_open(&f, slot_data, col_data)) {
        free(pre.p);
        return EMQ_ENOMEM;
    }
    f.pre = pre.p;
    f.prelen = pre.len;
    rc = stream_calls(c, &f, out);
    columns_close(&f);
    free(pre.p);
    return rc;
}
