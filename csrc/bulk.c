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
    size_t nrows, rows, ncalls;  /* rows of columns; rows per call; calls */
    size_t nslots, ncols;
    int64_t nkeyslots;           /* the first nkeyslots slots are KEYS */
    const char **slot_ptr;       /* constant part of each slot */
    const size_t *slot_lens;
    const int64_t *slot_col;     /* column appended to the slot, or -1 */
    const int64_t *slot_each;    /* NULL, or nonzero: repeated once per row of a call */
    const size_t *col_lens;      /* ncols * nrows lengths, column-major */
    const char **col_cur;        /* read position in each column (the call's first row) */
    const char **col_run;        /* scratch: positions while a run of repeated slots walks */
    const char *sha;
    size_t shalen;
    const char *pre;             /* "$7\r\nEVALSHA\r\n$40\r\n<sha>\r\n$<k>\r\n<k>\r\n" */
    size_t prelen;
    int64_t prekeys;             /* the <k> in pre: a full call's KEYS count */
    size_t next;                 /* next row to frame */
    size_t calls;                /* calls framed */
} frame_t;

static int repeated(const frame_t *f, size_t s)
{
    return f->rows > 1 && f->slot_each != NULL && f->slot_each[s] != 0;
}

/* Point each slot at its constant bytes and each column at its first value.
 * 0, or -1 on no memory (nothing to free then). */
static int columns_open(frame_t *f, const char *slot_data, const char *col_data)
{
    size_t ncols = f->ncols ? f->ncols : 1;
    f->slot_ptr = malloc(sizeof(char *) * (f->nslots ? f->nslots : 1));
    f->col_cur = malloc(sizeof(char *) * ncols);
    f->col_run = malloc(sizeof(char *) * ncols);
    if (f->slot_ptr == NULL || f->col_cur == NULL || f->col_run == NULL) {
        free(f->slot_ptr);
        free(f->col_cur);
        free(f->col_run);
        return -1;
    }
    for (size_t s = 0, off = 0; s < f->nslots; s++) {
        f->slot_ptr[s] = slot_data + off;
        off += f->slot_lens[s];
    }
    for (size_t k = 0, off = 0; k < f->ncols; k++) {
        f->col_cur[k] = col_data + off;
        for (size_t i = 0; i < f->nrows; i++)
            off += f->col_lens[k * f->nrows + i];
    }
    return 0;
}

static void columns_close(frame_t *f)
{
    free(f->slot_ptr);
    free(f->col_cur);
    free(f->col_run);
}

/* Slot s of row i, its column read at *at (which steps on when `step`). */
static int frame_slot(frame_t *f, emq_wbuf *w, size_t s, size_t i, const char **at)
{
    int64_t col = f->slot_col[s];
    if (col < 0)
        return emq_frame_bulk2(w, f->slot_ptr[s], f->slot_lens[s], NULL, 0);
    return emq_frame_bulk2(w, f->slot_ptr[s], f->slot_lens[s], at[col],
                           f->col_lens[(size_t)col * f->nrows + i]);
}

/* The command head of a call of n rows: "*<nargs>", EVALSHA, sha, numkeys. */
static int frame_head(frame_t *f, emq_wbuf *w, size_t n)
{
    uint64_t nargs = 3;
    int64_t numkeys = 0;
    for (size_t s = 0; s < f->nslots; s++) {
        size_t times = repeated(f, s) ? n : 1;
        nargs += times;
        if ((int64_t)s < f->nkeyslots)
            numkeys += (int64_t)times;
    }
    if (numkeys == f->prekeys)
        return emq_frame_head(w, nargs, f->pre, f->prelen);
    return emq_frame_head(w, nargs, NULL, 0) || emq_frame_evalsha(w, f->sha, f->shalen, numkeys);
}

/* Frame the call of the next rows into w and step every column past them. */
static int frame_call(frame_t *f, emq_wbuf *w)
{
    size_t i0 = f->next, n = f->nrows - i0;
    if (n > f->rows)
        n = f->rows;
    if (frame_head(f, w, n))
        return -1;
    for (size_t s = 0; s < f->nslots;) {
        if (!repeated(f, s)) { /* once per call; a column gives the call's first row */
            if (frame_slot(f, w, s++, i0, f->col_cur))
                return -1;
            continue;
        }
        size_t e = s; /* a run of repeated slots [s, e): row by row */
        while (e < f->nslots && repeated(f, e))
            e++;
        memcpy(f->col_run, f->col_cur, sizeof(char *) * f->ncols);
        for (size_t i = i0; i < i0 + n; i++) {
            for (size_t t = s; t < e; t++)
                if (frame_slot(f, w, t, i, f->col_run))
                    return -1;
            for (size_t k = 0; k < f->ncols; k++)
                f->col_run[k] += f->col_lens[k * f->nrows + i];
        }
        s = e;
    }
    for (size_t k = 0; k < f->ncols; k++)
        for (size_t i = i0; i < i0 + n; i++)
            f->col_cur[k] += f->col_lens[k * f->nrows + i];
    f->next += n;
    f->calls++;
    return 0;
}

/* Frame the next calls into w (emptied first: all of it was written) until it
 * holds about FRAME_BYTES. */
static int frame_more(frame_t *f, emq_wbuf *w)
{
    w->len = w->off = 0;
    while (f->next < f->nrows && w->len < FRAME_BYTES)
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
            rc = stream_step(c, &w, f->calls, timeout, &sent, out);
    }
    free(w.p);
    return rc;
}

int emq_evalsha_columns(emq_conn *c, const char *sha, size_t shalen, int64_t numkeys,
                        size_t ncalls, size_t nslots, const char *slot_data,
                        const size_t *slot_lens, const int64_t *slot_col, size_t ncols,
                        const char *col_data, const size_t *col_lens, emq_replies *out)
{
    return emq_evalsha_rows(c, sha, shalen, numkeys, ncalls, 1, nslots, slot_data, slot_lens,
                            slot_col, NULL, ncols, col_data, col_lens, out);
}

int emq_evalsha_rows(emq_conn *c, const char *sha, size_t shalen, int64_t nkeyslots,
                     size_t nrows, size_t rows, size_t nslots, const char *slot_data,
                     const size_t *slot_lens, const int64_t *slot_col,
                     const int64_t *slot_each, size_t ncols, const char *col_data,
                     const size_t *col_lens, emq_replies *out)
{
    emq_replies_reset(out);
    if (nrows == 0)
        return EMQ_OK;
    if (rows == 0 || shalen > 64 || nkeyslots < 0 || (size_t)nkeyslots > nslots)
        return EMQ_EINVAL;
    for (size_t s = 0; s < nslots; s++)
        if (slot_col[s] >= (int64_t)ncols)
            return EMQ_EINVAL;
    frame_t f = {nrows, rows, (nrows + rows - 1) / rows, nslots, ncols, nkeyslots, NULL,
                 slot_lens, slot_col, slot_each, col_lens, NULL, NULL, sha, shalen, NULL, 0, 0,
                 0, 0};
    int rc = emq_batch_begin(c, out, f.ncalls);
    if (rc != EMQ_OK)
        return rc;

    /* The leading arguments of every full call are the same: frame them once. */
    for (size_t s = 0; s < nslots; s++)
        if ((int64_t)s < nkeyslots)
            f.prekeys += repeated(&f, s) ? (int64_t)rows : 1;
    emq_wbuf pre = {NULL, 0, 0, 0};
    if (emq_frame_evalsha(&pre, sha, shalen, f.prekeys) || columns_open(&f, slot_data, col_data)) {
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
