/* pipeline.c - pipelined commands over one emq_conn, replies flattened.
 *
 * Commands are encoded as RESP into one buffer and written with send()
 * ourselves rather than through hiredis' output buffer: that way we know
 * whether any byte left, which decides if a failed batch may be retried.
 * Replies are read back with redisGetReply, copied into the flat emq_replies
 * layout (see emq.h) and freed at once. Batches larger than CHUNK_BYTES are
 * sent in chunks, each chunk's replies read before the next is written, so
 * neither side ever buffers more than a chunk.
 */
#define EMQ_INTERNAL
#include "emq.h"
#include "resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#ifndef MSG_NOSIGNAL /* macOS: Python ignores SIGPIPE anyway */
#define MSG_NOSIGNAL 0
#endif

#define CHUNK_BYTES ((size_t)8 << 20)

/* ---- growable buffers --------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int put_bulk(buf_t *b, const char *s, size_t len)
{
    if (emq_reserve((void **)&b->p, &b->cap, b->len, len + EMQ_HEADER_MAX + 2, 1))
        return -1;
    char *p = emq_put_header(b->p + b->len, '$', len);
    memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    b->len = (size_t)(p - b->p);
    return 0;
}

/* ---- I/O ---------------------------------------------------------------- */

/* Write all of buf; *sent counts bytes that left, even on failure. */
static int send_all(emq_conn *c, const char *p, size_t len, size_t *sent)
{
    while (len) {
        ssize_t n = send(c->ctx->fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
        *sent += (size_t)n;
    }
    return 0;
}

/* Fail the batch: the connection is closed either way, since unread replies
 * or a half-written command would desynchronise it. */
static int fail(emq_conn *c, const char *what, int saved_errno, size_t sent, buf_t *b)
{
    free(b->p);
    emq_conn_fail(c, what, saved_errno);
    return sent ? EMQ_EIO : EMQ_EUNSENT;
}

/* Encode, send and read back ncmds commands, each prefixed by `nfixed`
 * already-encoded arguments (prefix), in chunks of about CHUNK_BYTES. */
static int run_batch(emq_conn *c, const char *prefix, size_t prefixlen, size_t nfixed,
                     size_t ncmds, size_t argc, const size_t *argcs,
                     const char *data, const size_t *lens, emq_replies *out)
{
    buf_t b = {NULL, 0, 0};
    size_t sent = 0, cmd = 0, arg = 0;

    emq_replies_reset(out);
    for (size_t i = 0; argcs && i < ncmds; i++)
        if (argcs[i] + nfixed == 0) /* "*0" gets no reply: we would wait forever */
            return EMQ_EINVAL;
    if (argcs == NULL && ncmds && argc + nfixed == 0)
        return EMQ_EINVAL;
    if (c->ctx == NULL) {
        if (c->err[0] == '\0')
            strcpy(c->err, "not connected");
        return EMQ_EUNSENT;
    }
    if (emq_reserve((void **)&out->ints, &out->ints_cap, 0, ncmds ? ncmds : 1, sizeof(int64_t)))
        return EMQ_ENOMEM;

    while (cmd < ncmds) {
        size_t first = cmd;
        b.len = 0;
        while (cmd < ncmds && b.len < CHUNK_BYTES) {
            size_t k = argcs ? argcs[cmd] : argc;
            if (emq_reserve((void **)&b.p, &b.cap, b.len, EMQ_HEADER_MAX + prefixlen, 1))
                goto nomem;
            char *p = emq_put_header(b.p + b.len, '*', k + nfixed);
            memcpy(p, prefix, prefixlen);
            b.len = (size_t)(p - b.p) + prefixlen;
            for (size_t j = 0; j < k; j++, arg++) {
                if (put_bulk(&b, data, lens[arg]))
                    goto nomem;
                data += lens[arg];
            }
            cmd++;
        }
        size_t before = sent;
        if (send_all(c, b.p, b.len, &sent)) {
            if (sent > before) /* part of this chunk left: any of its commands may have */
                out->nsent = cmd;
            return fail(c, "write to redis", errno, sent, &b);
        }
        out->nsent = cmd;
        for (size_t i = first; i < cmd; i++) {
            void *reply = NULL;
            if (redisGetReply(c->ctx, &reply) != REDIS_OK || reply == NULL)
                return fail(c, "read from redis", errno, sent, &b);
            const redisReply *x = reply;
            int is_int = x->type == REDIS_REPLY_INTEGER;
            out->ints[i] = is_int ? x->integer : 0;
            out->all_int &= is_int;
            int rc = emq_flatten(out, x);
            freeReplyObject(reply);
            out->nreplies++;
            if (rc) {
                /* Replies still in flight: drop the connection. */
                free(b.p);
                emq_conn_close(c);
                strcpy(c->err, "out of memory while reading replies");
                return EMQ_ENOMEM;
            }
        }
    }
    free(b.p);
    return EMQ_OK;

nomem:
    /* Earlier chunks (if any) were fully answered: the connection is in sync. */
    free(b.p);
    strcpy(c->err, "out of memory while encoding commands");
    return EMQ_ENOMEM;
}

int emq_evalsha_batch(emq_conn *c, const char *sha, size_t shalen, int64_t numkeys,
                      size_t ncalls, size_t argc, const size_t *argcs,
                      const char *data, const size_t *lens, emq_replies *out)
{
    /* The three leading arguments are the same for every call: encode once. */
    char num[24];
    char *end = numkeys < 0 ? (num[0] = '-', emq_put_uint(num + 1, (uint64_t)0 - (uint64_t)numkeys))
                            : emq_put_uint(num, (uint64_t)numkeys);
    buf_t pre = {NULL, 0, 0};
    if (put_bulk(&pre, "EVALSHA", 7) || put_bulk(&pre, sha, shalen)
        || put_bulk(&pre, num, (size_t)(end - num))) {
        free(pre.p);
        return EMQ_ENOMEM;
    }
    int rc = run_batch(c, pre.p, pre.len, 3, ncalls, argc, argcs, data, lens, out);
    free(pre.p);
    return rc;
}

int emq_command_batch(emq_conn *c, size_t ncmds, size_t argc, const size_t *argcs,
                      const char *data, const size_t *lens, emq_replies *out)
{
    return run_batch(c, "", 0, 0, ncmds, argc, argcs, data, lens, out);
}
