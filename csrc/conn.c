/* conn.c - one blocking hiredis connection: connect (TCP, unix socket or TLS),
 * AUTH, SELECT, timeouts, a cheap liveness probe and the one write call the
 * batches use (emq_conn_send: plain send() or SSL_write).
 *
 * hiredis is the pinned copy in vendor/hiredis (1.3.0), compiled in; TLS is
 * compiled only with EMQ_TLS (build_ffi.py: OpenSSL found). Replies are read
 * through hiredis (redisBufferRead), which reads through TLS by itself.
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

#ifndef MSG_NOSIGNAL /* macOS: Python ignores SIGPIPE anyway */
#define MSG_NOSIGNAL 0
#endif

emq_conn *emq_conn_new(void)
{
    return calloc(1, sizeof(emq_conn));
}

void emq_conn_close(emq_conn *c)
{
    if (c->ctx) {
        redisFree(c->ctx); /* frees the SSL too */
        c->ctx = NULL;
    }
    c->tls = NULL;
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

#ifdef EMQ_TLS
#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <hiredis/hiredis_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>

int emq_tls_built(void)
{
    return 1;
}

/* "connect: <what>: <OpenSSL's reason>"; 0 for the caller's return. */
static int tls_failed(emq_conn *c, const char *what)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e ? ERR_reason_error_string(e) : NULL;
    snprintf(c->err, sizeof c->err, "connect: %s: %s", what, why ? why : "TLS error");
    return 0;
}

/* An SSL_CTX for one connection: protocol floor, verification, CA and client
 * certificate, as Python's ssl module (redis-py) would set them up. */
static SSL_CTX *tls_context(emq_conn *c, const char *ca_file, const char *ca_path,
                            const char *cert_file, const char *key_file, int verify)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return tls_failed(c, "TLS context"), NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION); /* Python's client default */
    SSL_CTX_set_verify(ctx, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    int ok = 1;
    if (verify)
        ok = (ca_file || ca_path) ? SSL_CTX_load_verify_locations(ctx, ca_file, ca_path)
                                  : SSL_CTX_set_default_verify_paths(ctx);
    if (!ok)
        tls_failed(c, "loading the CA certificates (ssl_ca_certs / ssl_ca_path)");
    else if (cert_file && (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1
                           || SSL_CTX_use_PrivateKey_file(ctx, key_file ? key_file : cert_file,
                                                          SSL_FILETYPE_PEM) != 1
                           || SSL_CTX_check_private_key(ctx) != 1))
        ok = tls_failed(c, "loading the client certificate (ssl_certfile / ssl_keyfile)");
    if (!ok) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* SNI (names only, never an IP literal) and the name the certificate must carry. */
static int tls_name(emq_conn *c, SSL *ssl, const char *host, int check_hostname)
{
    unsigned char addr[sizeof(struct in6_addr)];
    int is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
    if (!is_ip && !SSL_set_tlsext_host_name(ssl, host))
        return tls_failed(c, "TLS server name (SNI)");
    if (!check_hostname)
        return 1;
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host)
                   : X509_VERIFY_PARAM_set1_host(param, host, 0);
    return ok ? 1 : tls_failed(c, "TLS host name check");
}

static void tls_use_our_read(redisContext *ctx, SSL *ssl);

/* Handshake on the connected c->ctx; on failure the connection is closed. */
static int tls_handshake(emq_conn *c, SSL_CTX *sctx, const char *host, int check_hostname)
{
    SSL *ssl = SSL_new(sctx);
    if (ssl == NULL || !tls_name(c, ssl, host, check_hostname)) {
        if (ssl == NULL)
            tls_failed(c, "TLS session");
        SSL_free(ssl);
        emq_conn_close(c);
        return EMQ_ECONNECT;
    }
    /* Partial writes: a full socket takes what fits, as send() does (bulk.c streams). */
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE);
    if (redisInitiateSSL(c->ctx, ssl) != REDIS_OK) {
        long verdict = SSL_get_verify_result(ssl);
        if (verdict != X509_V_OK)
            snprintf(c->err, sizeof c->err, "connect: TLS handshake: certificate verify failed (%s)",
                     X509_verify_cert_error_string(verdict));
        else
            snprintf(c->err, sizeof c->err, "connect: TLS handshake: %s", c->ctx->errstr);
        SSL_free(ssl); /* hiredis owns it only once the handshake succeeded */
        emq_conn_close(c);
        return EMQ_ECONNECT;
    }
    c->tls = ssl;
    tls_use_our_read(c->ctx, ssl);
    return EMQ_OK;
}

int emq_conn_open_tls(emq_conn *c, const char *host, int port,
                      double connect_timeout, double io_timeout,
                      const char *ca_file, const char *ca_path, const char *cert_file,
                      const char *key_file, int verify, int check_hostname)
{
    static int initialised; /* a racing second call is harmless: OpenSSL inits once */
    if (!initialised)
        initialised = redisInitOpenSSL() == REDIS_OK;
    /* The handshake runs under the connect timeout; the I/O one is set after it. */
    int rc = emq_conn_open_tcp(c, host, port, connect_timeout, connect_timeout);
    if (rc != EMQ_OK)
        return rc;
    SSL_CTX *sctx = tls_context(c, ca_file, ca_path, cert_file, key_file, verify);
    if (sctx == NULL) {
        emq_conn_close(c);
        return EMQ_ECONNECT;
    }
    ERR_clear_error();
    rc = tls_handshake(c, sctx, host, verify && check_hostname);
    SSL_CTX_free(sctx); /* the SSL keeps its own reference */
    if (rc == EMQ_OK && redisSetTimeout(c->ctx, to_timeval(io_timeout)) != REDIS_OK) {
        emq_conn_fail(c, "connect: cannot set socket timeout", errno);
        rc = EMQ_ECONNECT;
    }
    return rc;
}

/* Make fd non-blocking (on=1, remembering its flags in *saved) or restore them. */
static int set_nonblocking(int fd, int on, int *saved)
{
    if (on) {
        *saved = fcntl(fd, F_GETFL);
        return *saved < 0 ? -1 : fcntl(fd, F_SETFL, *saved | O_NONBLOCK);
    }
    return fcntl(fd, F_SETFL, *saved);
}

/* Wait (poll) until fd has `events`, within the socket's receive timeout (none: as
 * long as it takes). 1 ready, 0 timed out, -1 failed (errno). */
static int tls_wait(int fd, short events)
{
    struct timeval tv = {0, 0};
    socklen_t len = sizeof tv;
    int timeout = -1;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) == 0 && (tv.tv_sec || tv.tv_usec))
        timeout = (int)(tv.tv_sec * 1000 + tv.tv_usec / 1000) + 1;
    struct pollfd p = {fd, events, 0};
    int n;
    do {
        n = poll(&p, 1, timeout);
    } while (n < 0 && errno == EINTR);
    return n;
}

/* Record a failed TLS read on the context as hiredis' own reads do; returns -1. */
static ssize_t tls_read_failed(redisContext *ctx, int err, int saved_errno)
{
    unsigned long e = ERR_peek_last_error();
    int eof = err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && saved_errno == 0);
    ctx->err = eof ? REDIS_ERR_EOF : REDIS_ERR_IO;
    if (eof)
        snprintf(ctx->errstr, sizeof ctx->errstr, "Server closed the connection");
    else if (err == SSL_ERROR_SYSCALL)
        snprintf(ctx->errstr, sizeof ctx->errstr, "%s", strerror(saved_errno));
    else
        snprintf(ctx->errstr, sizeof ctx->errstr, "TLS: %s",
                 e && ERR_reason_error_string(e) ? ERR_reason_error_string(e) : "read failed");
    errno = err == SSL_ERROR_SYSCALL && saved_errno ? saved_errno : EPROTO;
    return -1;
}

/* The read hiredis makes on a TLS connection of ours. hiredis' own blocks in SSL_read
 * until application data arrives, but a readable socket may hold only TLS housekeeping
 * (TLS 1.3 session tickets, sent after the handshake) or part of a record: a streamed
 * batch (bulk.c), which reads what poll() says arrived while it still has requests to
 * write, would then wait for replies to requests it has not sent yet. This one never
 * blocks once bytes were consumed: it returns 0 (hiredis' "nothing yet") after
 * housekeeping, and waits (within the receive timeout) only while nothing arrives. */
static ssize_t tls_read(redisContext *ctx, char *buf, size_t cap)
{
    SSL *ssl = ctx->privdata;
    BIO *rbio = SSL_get_rbio(ssl);
    for (;;) {
        uint64_t before = BIO_number_read(rbio);
        int flags = 0;
        if (set_nonblocking(ctx->fd, 1, &flags) < 0)
            return tls_read_failed(ctx, SSL_ERROR_SYSCALL, errno);
        ERR_clear_error();
        errno = 0;
        int n = SSL_read(ssl, buf, cap > INT_MAX ? INT_MAX : (int)cap);
        int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl, n), saved = errno;
        set_nonblocking(ctx->fd, 0, &flags);
        if (n > 0)
            return n;
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
            return tls_read_failed(ctx, err, saved);
        if (BIO_number_read(rbio) != before)
            return 0; /* housekeeping or a partial record: progress, no data yet */
        int ready = tls_wait(ctx->fd, err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN);
        if (ready <= 0)
            return tls_read_failed(ctx, SSL_ERROR_SYSCALL, ready == 0 ? EAGAIN : errno);
    }
}

static redisContextFuncs tls_funcs; /* hiredis' TLS functions with tls_read */
static pthread_once_t tls_funcs_once = PTHREAD_ONCE_INIT;
static const redisContextFuncs *hiredis_tls_funcs;

static void tls_funcs_init(void)
{
    tls_funcs = *hiredis_tls_funcs;
    tls_funcs.read = tls_read;
}

/* Route the context's reads through tls_read (writes stay hiredis', or ours). */
static void tls_use_our_read(redisContext *ctx, SSL *ssl)
{
    hiredis_tls_funcs = ctx->funcs;
    pthread_once(&tls_funcs_once, tls_funcs_init);
    ctx->privdata = ssl;
    ctx->funcs = &tls_funcs;
}

static ssize_t tls_send(emq_conn *c, const char *buf, size_t len, int dontwait)
{
    int fd = c->ctx->fd, flags = 0;
    if (dontwait && set_nonblocking(fd, 1, &flags) < 0)
        return -1;
    ERR_clear_error();
    errno = 0;
    int n = SSL_write(c->tls, buf, len > INT_MAX ? INT_MAX : (int)len);
    int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(c->tls, n), saved = errno;
    if (dontwait)
        set_nonblocking(fd, 0, &flags);
    if (n > 0)
        return n;
    /* A retry must offer the same bytes again: the caller's buffer keeps them. */
    if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ)
        errno = EAGAIN;
    else if (err == SSL_ERROR_SYSCALL && saved)
        errno = saved;
    else
        errno = err == SSL_ERROR_ZERO_RETURN ? ECONNRESET : EPROTO;
    return -1;
}

ssize_t emq_conn_send(emq_conn *c, const char *buf, size_t len, int dontwait)
{
    if (c->tls)
        return tls_send(c, buf, len, dontwait);
    return send(c->ctx->fd, buf, len, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
}

/* A readable TLS socket may carry housekeeping only (TLS 1.3 session tickets come
 * after the handshake): peek without blocking; idle when no application byte is there. */
static int tls_idle(emq_conn *c, int readable)
{
    if (c->tls == NULL || !readable)
        return !readable && (c->tls == NULL || SSL_pending(c->tls) == 0);
    int flags = 0;
    if (set_nonblocking(c->ctx->fd, 1, &flags) < 0)
        return 0;
    char byte;
    ERR_clear_error();
    int n = SSL_peek(c->tls, &byte, 1);
    int err = n > 0 ? SSL_ERROR_NONE : SSL_get_error(c->tls, n);
    set_nonblocking(c->ctx->fd, 0, &flags);
    return n <= 0 && err == SSL_ERROR_WANT_READ;
}
#else
int emq_tls_built(void)
{
    return 0;
}

int emq_conn_open_tls(emq_conn *c, const char *host, int port,
                      double connect_timeout, double io_timeout,
                      const char *ca_file, const char *ca_path, const char *cert_file,
                      const char *key_file, int verify, int check_hostname)
{
    (void)host, (void)port, (void)connect_timeout, (void)io_timeout, (void)ca_file;
    (void)ca_path, (void)cert_file, (void)key_file, (void)verify, (void)check_hostname;
    emq_conn_close(c);
    snprintf(c->err, sizeof c->err, "connect: this build of the C core has no TLS");
    return EMQ_ECONNECT;
}

ssize_t emq_conn_send(emq_conn *c, const char *buf, size_t len, int dontwait)
{
    return send(c->ctx->fd, buf, len, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
}

static int tls_idle(emq_conn *c, int readable)
{
    (void)c;
    return !readable;
}
#endif

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

int emq_conn_set_timeout(emq_conn *c, double io_timeout)
{
    if (c->ctx == NULL) {
        snprintf(c->err, sizeof c->err, "set timeout: not connected");
        return EMQ_ECONNECT;
    }
    if (redisSetTimeout(c->ctx, to_timeval(io_timeout)) != REDIS_OK) {
        emq_conn_fail(c, "cannot set socket timeout", errno);
        return EMQ_ECONNECT;
    }
    return EMQ_OK;
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
    return n >= 0 && tls_idle(c, n > 0);
}
