/* pipeline.c - pipelined commands over one emq_conn, replies flattened.
 *
 * Commands are framed as RESP into one buffer (resp.c) and written with
 * send() ourselves rather than through hiredis' output buffer: that way we
 * know whether any byte left, which decides if a failed batch may be retried.
 * Replies are read back through hiredis' reader, copied into the flat
 * emq_replies layout (see emq.h) and freed at once. Batches larger than
 * CHUNK_BYTES are sent in chunks, each chunk's replies read before the next is
 * written, so neither side ever buffers more than a chunk. (bulk.c streams
 * instead: it writes and reads at once, with the same helpers.)
 */
#define EMQ_INTERNAL
#include "emq.h"
#include "resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES ((size_t)8 << 20)

/* The commands of one batch, each `nfixed` already-framed arguments (prefix)
 * followed by its own; `data`, `cmd` and `arg` advance as commands are framed. */
typedef struct {
    const char *prefix;
    size_t prefixlen, nfixed;
    size_t ncmds, argc;  /* call i has argcs[i] arguments, or argc when argcs is NULL */
    const size_t *argcs;
    const char *data;    /* next argument's bytes */
    const size_t *lens;  /* every argument's length */
    size_t cmd, arg;     /* next command to frame, its first argument */
} cmds_t;

/* "*0" gets no reply: we would wait forever. */
static int has_empty_command(const cmds_t *m)
{
    for (size_t i = 0; m->argcs && i < m->ncmds; i++)
        if (m->argcs[i] + m->nfixed == 0)
            return 1;
    return m->argcs == NULL && m->ncmds && m->argc + m->nfixed == 0;
}

/* Frame the next commands into b (emptied first) until it holds CHUNK_BYTES. */
static int frame_chunk(cmds_t *m, emq_wbuf *b)
{
    b->len = b->off = 0;
    while (m->cmd < m->ncmds && b->len < CHUNK_BYTES) {
        size_t k = m->argcs ? m->argcs[m->cmd] : m->argc;
        if (emq_frame_head(b, k + m->nfixed, m->prefix, m->prefixlen))
            return -1;
        for (size_t j = 0; j < k; j++, m->arg++) {
            if (emq_frame_bulk2(b, m->data, m->lens[m->arg], NULL, 0))
                return -1;
            m->data += m->lens[m->arg];
        }
        m->cmd++;
    }
    return 0;
}

/* Write all of b (blocking); calls [0, upto) count as sent once any byte of
 * theirs may have left. */
static int send_chunk(emq_conn *c, emq_wbuf *b, size_t upto, size_t *sent, emq_replies *out)
{
    size_t before = *sent;
    while (b->off < b->len) {
        if (emq_batch_send(c, b, 0, sent)) {
            int saved = errno;
            if (*sent > before) /* part of this chunk left: any of its commands may have */
                out->nsent = upto;
            return emq_batch_fail(c, "write to redis", saved, *sent);
        }
    }
    out->nsent = upto;
    return EMQ_OK;
}

/* Read (blocking) until calls [0, upto) are all answered. */
static int await_replies(emq_conn *c, emq_replies *out, size_t upto, size_t sent)
{
    for (;;) {
        int rc = emq_batch_take_replies(c, out, upto, sent);
        if (rc != EMQ_OK || out->nreplies >= upto)
            return rc;
        if (redisBufferRead(c->ctx) != REDIS_OK)
            return emq_batch_fail(c, "read from redis", errno, sent);
    }
}

/* Frame, send and read back the commands of m, in chunks of about CHUNK_BYTES. */
static int run_batch(emq_conn *c, cmds_t *m, emq_replies *out)
{
    emq_replies_reset(out);
    if (has_empty_command(m))
        return EMQ_EINVAL;
    int rc = emq_batch_begin(c, out, m->ncmds);
    emq_wbuf b = {NULL, 0, 0, 0};
    size_t sent = 0;
    while (rc == EMQ_OK && m->cmd < m->ncmds) {
        if (frame_chunk(m, &b)) {
            /* Earlier chunks (if any) were fully answered: the connection is in sync. */
            strcpy(c->err, "out of memory while encoding commands");
            rc = EMQ_ENOMEM;
            break;
        }
        rc = send_chunk(c, &b, m->cmd, &sent, out);
        if (rc == EMQ_OK)
            rc = await_replies(c, out, m->cmd, sent);
    }
    free(b.p);
    return rc;
}

int emq_evalsha_batch(emq_conn *c, const char *sha, size_t shalen, int64_t numkeys,
                      size_t ncalls, size_t argc, const size_t *argcs,
                      const char *data, const size_t *lens, emq_replies *out)
{
    /* The three leading arguments are the same for every call: frame them once. */
    emq_wbuf pre = {NULL, 0, 0, 0};
    if (emq_frame_evalsha(&pre, sha, shalen, numkeys)) {
        free(pre.p);
        return EMQ_ENOMEM;
    }
    cmds_t m = {pre.p, pre.len, 3, ncalls, argc, argcs, data, lens, 0, 0};
    int rc = run_batch(c, &m, out);
    free(pre.p);
    return rc;
}

int emq_command_batch(emq_conn *c, size_t ncmds, size_t argc, const size_t *argcs,
                      const char *data, const size_t *lens, emq_replies *out)
{
    cmds_t m = {"", 0, 0, ncmds, argc, argcs, data, lens, 0, 0};
    return run_batch(c, &m, out);
}
