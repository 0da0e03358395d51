/* conn.c - one blocking hiredis connection: connect (TCP or unix socket),
 * AUTH, SELECT, timeouts and a cheap liveness probe.
 *
 * Only the hiredis calls present in both 0.14 and 1.x are used
 * (redisConnect*WithTimeout, redisSetTimeout, redisCommandArgv).
 */
#define EMQ_INTERNAL
#include "emq.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

emq_conn *emq_conn_new(void)
{
    return calloc(1, sizeof(emq_conn));
}

void emq_conn_close(emq_conn *c)
{
    if (c->ctx) {
        redisFree(c->ctx);
        c->ctx = NULL;
    }
}

void emq_conn_free(emq_conn *c)
{
    if (c) {
        emq_conn_close(c);
        free(c);
    }
}

const char *emq_conn_error(const emq_conn *c)
{
    return c->err;
}

void emq_conn_fail(emq_conn *c, const char *what, int saved_errno)
{
    int would_block = saved_errno == EAGAIN || saved_errno == EWOULDBLOCK;
    int timed_out = would_block; /* our own send(): errno is fresh */
    const char *cause = saved_errno ? strerror(saved_errno) : "connection lost";
    if (c->ctx && c->ctx->err) { /* a hiredis failure: errno only counts for I/O */
        cause = c->ctx->errstr;
        timed_out = c->ctx->err == REDIS_ERR_IO && would_block;
#ifdef REDIS_ERR_TIMEOUT /* hiredis >= 1.0 reports timeouts itself */
        timed_out = timed_out || c->ctx->err == REDIS_ERR_TIMEOUT;
#endif
    }
    if (timed_out)
        cause = "timed out (socket_timeout)";
    snprintf(c->err, sizeof c->err, "%s: %s", what, cause);
    emq_conn_close(c);
}

static struct timeval to_timeval(double seconds)
{
    struct timeval tv = {0, 0}; /* zero: block forever */
    if (seconds > 0 && isfinite(seconds)) {
        tv.tv_sec = (time_t)seconds;
        tv.tv_usec = (suseconds_t)((seconds - (double)tv.tv_sec) * 1e6);
        if (tv.tv_sec == 0 && tv.tv_usec == 0)
            tv.tv_usec = 1;
    }
    return tv;
}

/* Adopt a freshly connected context, or record why it failed. */
static int adopt(emq_conn *c, redisContext *ctx, double io_timeout)
{
    if (ctx == NULL) {
        snprintf(c->err, sizeof c->err, "connect: out of memory");
        return EMQ_ENOMEM;
    }
    if (ctx->err) {
        snprintf(c->err, sizeof c->err, "connect: %s", ctx->errstr);
        redisFree(ctx);
        return EMQ_ECONNECT;
    }
    /* Always set it: the connect timeout must not linger as a read timeout. */
    if (redisSetTimeout(ctx, to_timeval(io_timeout)) != REDIS_OK) {
        snprintf(c->err, sizeof c->err, "connect: cannot set socket timeout: %s",
                 ctx->err ? ctx->errstr : strerror(errno));
        redisFree(ctx);
        return EMQ_ECONNECT;
    }
    c->ctx = ctx;
    c->err[0] = '\0';
    return EMQ_OK;
}

int emq_conn_open_tcp(emq_conn *c, const char *host, int port,
                      double connect_timeout, double io_timeout)
{
    emq_conn_close(c);
    redisContext *ctx = connect_timeout > 0
        ? redisConnectWithTimeout(host, port, to_timeval(connect_timeout))
        : redisConnect(host, port);
    return adopt(c, ctx, io_timeout);
}

int emq_conn_open_unix(emq_conn *c, const char *path,
                       double connect_timeout, double io_timeout)
{
    emq_conn_close(c);
    redisContext *ctx = connect_timeout > 0
        ? redisConnectUnixWithTimeout(path, to_timeval(connect_timeout))
        : redisConnectUnix(path);
    return adopt(c, ctx, io_timeout);
}

/* Run one setup command; any failure closes the connection. */
static int setup_command(emq_conn *c, const char *name, int argc,
                         const char **argv, const size_t *lens)
{
    if (c->ctx == NULL) {
        snprintf(c->err, sizeof c->err, "%s: not connected", name);
        return EMQ_ECONNECT;
    }
    redisReply *r = redisCommandArgv(c->ctx, argc, argv, lens);
    if (r == NULL) {
        emq_conn_fail(c, name, errno);
        return EMQ_ECONNECT;
    }
    int rc = EMQ_OK;
    if (r->type == REDIS_REPLY_ERROR) {
        /* The server's text only; the command (and so the password) is not echoed. */
        snprintf(c->err, sizeof c->err, "%s failed: %.*s", name, (int)r->len, r->str);
        emq_conn_close(c);
        rc = EMQ_ECONNECT;
    }
    freeReplyObject(r);
    return rc;
}

int emq_conn_auth(emq_conn *c, const char *user, size_t userlen,
                  const char *password, size_t passwordlen)
{
    const char *argv[3] = {"AUTH", user, password};
    size_t lens[3] = {4, userlen, passwordlen};
    if (user == NULL) {
        argv[1] = password;
        lens[1] = passwordlen;
        return setup_command(c, "AUTH", 2, argv, lens);
    }
    return setup_command(c, "AUTH", 3, argv, lens);
}

int emq_conn_select(emq_conn *c, int64_t db)
{
    char num[24];
    int n = snprintf(num, sizeof num, "%lld", (long long)db);
    const char *argv[2] = {"SELECT", num};
    size_t lens[2] = {6, (size_t)n};
    return setup_command(c, "SELECT", 2, argv, lens);
}

int emq_conn_usable(emq_conn *c)
{
    redisContext *ctx = c->ctx;
    if (ctx == NULL || ctx->err)
        return 0;
    /* Unparsed bytes left in the reader would desynchronise the next batch. */
    if (ctx->reader && ctx->reader->pos < ctx->reader->len)
        return 0;
    /* An idle healthy socket is not readable. Readable means the server hung
     * up (EOF), reset, or sent something we did not ask for: all unusable. */
    struct pollfd p = {ctx->fd, POLLIN, 0};
    int n;
    do {
        n = poll(&p, 1, 0);
    } while (n < 0 && errno == EINTR);
    return n == 0;
}
