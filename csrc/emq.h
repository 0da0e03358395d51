/* emq.h - the C core of emqfast: score packing, backoff curves and a
 * pipelined EVALSHA batcher over hiredis.
 *
 * The region between CDEF-BEGIN and CDEF-END is fed verbatim to cffi's
 * ffi.cdef() by build_ffi.py, so it must stay plain declarations: no
 * #include, no #if, only integer #defines. Anything hiredis-specific stays
 * out of it (emq_conn is opaque) so the Python side never depends on the
 * hiredis ABI, which differs between 0.14 and 1.x.
 *
 * Arithmetic contract: every function returns exactly what its twin in
 * emqfast/backends/pure.py returns (tests/test_parity.py checks it). Inputs C cannot
 * represent or compute exactly yield EMQ_EDOMAIN; the Python wrapper then
 * hands them to the reference implementation.
 */
#ifndef EMQ_H
#define EMQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF-BEGIN */

/* Status codes. Arithmetic functions that return a non-negative int64 report
 * failure as the negated code. */
#define EMQ_OK 0
#define EMQ_ERANGE 1   /* value outside the range the keyspace can hold */
#define EMQ_EDOMAIN 2  /* input outside what C computes exactly: use _pure */
#define EMQ_ENOMEM 3
#define EMQ_ECONNECT 4 /* could not connect, authenticate or select the db */
#define EMQ_EUNSENT 5  /* connection failed before any byte of the batch left */
#define EMQ_EIO 6      /* connection failed after sending: outcome unknown */
#define EMQ_EINVAL 7   /* malformed call: a command with no arguments */

/* Score layout (mirrors emqfast/backends/pure.py). */
#define EMQ_EPOCH_MS 1704067200000
#define EMQ_SEQ_BITS 12
#define EMQ_SEQ_MASK 4095
#define EMQ_MAX_OFFSET_MS 2199023255551
#define EMQ_MAX_RUN_AT_MS 3903090455551
#define EMQ_PRIORITY_MAX 2097151

/* Backoff kinds and the largest base/cap C computes (larger: EMQ_EDOMAIN). */
#define EMQ_KIND_FIXED 0
#define EMQ_KIND_EXPONENTIAL 1
#define EMQ_BACKOFF_MAX_MS 4611686018427387904

typedef struct emq_pair {
    int64_t hi; /* run_at_ms or priority */
    int64_t lo; /* seq or counter */
} emq_pair;

typedef struct emq_splitmix {
    uint64_t state;
    uint64_t output;
} emq_splitmix;

/* scores.c: -EMQ_ERANGE on a run_at/priority out of range, else the score. */
int64_t emq_pack_delayed(int64_t run_at_ms, int64_t seq);
emq_pair emq_unpack_delayed(int64_t score);
int64_t emq_pack_priority(int64_t priority, int64_t counter);
emq_pair emq_unpack_priority(int64_t score);
/* Batch forms: EMQ_OK, or the code of the first failing item (*failed_at). */
int emq_pack_delayed_many(const int64_t *run_ats, const int64_t *seqs, size_t n,
                          int64_t *out, size_t *failed_at);
int emq_pack_priority_many(const int64_t *priorities, const int64_t *counters, size_t n,
                           int64_t *out, size_t *failed_at);

/* backoff.c: the delay in ms, or -EMQ_ERANGE (attempts < 1) / -EMQ_EDOMAIN. */
emq_splitmix emq_splitmix64(uint64_t state);
int64_t emq_backoff_delay(int kind, int64_t base_ms, int64_t cap_ms, double band, int full,
                          uint64_t attempts, uint64_t seed);
int emq_backoff_delay_many(int kind, int64_t base_ms, int64_t cap_ms, double band, int full,
                           const uint64_t *attempts, const uint64_t *seeds, size_t n,
                           int64_t *out, size_t *failed_at);

/* conn.c: one blocking hiredis connection. Timeouts in seconds; <= 0 means
 * none. Error text (never containing credentials) via emq_conn_error(). */
typedef struct emq_conn emq_conn;
emq_conn *emq_conn_new(void);
void emq_conn_free(emq_conn *c);
int emq_conn_open_tcp(emq_conn *c, const char *host, int port,
                      double connect_timeout, double io_timeout);
int emq_conn_open_unix(emq_conn *c, const char *path,
                       double connect_timeout, double io_timeout);
/* AUTH [user] password; user may be NULL for the legacy one-argument form. */
int emq_conn_auth(emq_conn *c, const char *user, size_t userlen,
                  const char *password, size_t passwordlen);
int emq_conn_select(emq_conn *c, int64_t db);
/* TLS (rediss://): 1 when this build has it (hiredis ssl.c + OpenSSL), else 0 and
 * emq_conn_open_tls fails. Like open_tcp, then a TLS handshake within connect_timeout.
 * Files may be NULL (no CA files: the system's defaults); key_file NULL: in cert_file.
 * verify 0: no certificate check, else the chain must verify and, with
 * check_hostname, name `host` (a DNS name or IP literal; also sent as SNI). */
int emq_tls_built(void);
int emq_conn_open_tls(emq_conn *c, const char *host, int port,
                      double connect_timeout, double io_timeout,
                      const char *ca_file, const char *ca_path, const char *cert_file,
                      const char *key_file, int verify, int check_hostname);
/* The read and write deadline of the open connection, in seconds (<= 0: none); for a
 * batch that blocks on the server (WAIT) longer than the usual deadline. EMQ_OK, or
 * EMQ_ECONNECT when closed or the socket refuses it. */
int emq_conn_set_timeout(emq_conn *c, double io_timeout);
/* 1 when open and idle: no error, no unread bytes, peer has not hung up. */
int emq_conn_usable(emq_conn *c);
void emq_conn_close(emq_conn *c);
const char *emq_conn_error(const emq_conn *c);

/* pipeline.c: replies flattened for cheap conversion in Python.
 * nodes holds 3 int64 per reply node in pre-order: (type, a, b), where
 *   EMQ_R_INT:    a = value
 *   EMQ_R_BYTES / EMQ_R_ERROR / EMQ_R_DOUBLE / EMQ_R_BIGNUM:
 *                 a = offset into data, b = length
 *   EMQ_R_NIL:    -
 *   EMQ_R_ARRAY:  a = number of child nodes that follow (maps are flattened)
 * ints[i] is the value of top-level reply i when it is an integer; all_int
 * says every top-level reply is one, so Python can skip the node walk. */
#define EMQ_R_INT 1
#define EMQ_R_BYTES 2
#define EMQ_R_NIL 3
#define EMQ_R_ERROR 4
#define EMQ_R_ARRAY 5
#define EMQ_R_DOUBLE 6
#define EMQ_R_BIGNUM 7

typedef struct emq_replies {
    size_t nreplies;
    int all_int;
    int64_t *ints;
    size_t ints_cap;
    int64_t *nodes;
    size_t nnodes;
    size_t nodes_cap;
    char *data;
    size_t datalen;
    size_t data_cap;
    /* Calls at least one byte of which left the client: when a batch fails with
     * EMQ_EIO, replies [0, nreplies) arrived, calls [nreplies, nsent) were sent
     * without a reply (they may have run), calls [nsent, ncalls) never left. */
    size_t nsent;
} emq_replies;

/* Pipelines `EVALSHA sha numkeys <args>` for ncalls calls. The arguments of
 * all calls lie back to back in data, with lens[k] the length of argument k;
 * call i has argcs[i] arguments, or argc each when argcs is NULL. Replies
 * overwrite *out (its buffers are reused; release with emq_replies_free).
 * Returns EMQ_OK, EMQ_EUNSENT (safe to reconnect and retry), EMQ_EIO,
 * EMQ_ENOMEM or EMQ_EINVAL; on EMQ_EUNSENT/EMQ_EIO the connection is closed. */
int emq_evalsha_batch(emq_conn *c, const char *sha, size_t shalen, int64_t numkeys,
                      size_t ncalls, size_t argc, const size_t *argcs,
                      const char *data, const size_t *lens, emq_replies *out);
/* Same, for arbitrary commands (each command's arguments include its name). */
int emq_command_batch(emq_conn *c, size_t ncmds, size_t argc, const size_t *argcs,
                      const char *data, const size_t *lens, emq_replies *out);
void emq_replies_free(emq_replies *r);

/* bulk.c: ncalls `EVALSHA sha numkeys a_1 .. a_nslots` where slot s is the
 * constant slot_lens[s] bytes (slots back to back in slot_data) followed, when
 * slot_col[s] >= 0, by call i's value of that column. Columns lie back to back
 * in col_data; col_lens holds ncols * ncalls lengths, column by column. Framed
 * in C and streamed (writes and reads overlap); returns like emq_evalsha_batch. */
int emq_evalsha_columns(emq_conn *c, const char *sha, size_t shalen, int64_t numkeys,
                        size_t ncalls, size_t nslots, const char *slot_data,
                        const size_t *slot_lens, const int64_t *slot_col, size_t ncols,
                        const char *col_data, const size_t *col_lens, emq_replies *out);
/* Same with `rows` rows of the columns per call (enqueue_many.lua admits a
 * chunk of jobs per call): nrows rows make ceil(nrows / rows) calls, the last one the
 * rest. A slot with slot_each[s] != 0 (slot_each may be NULL: none) is repeated once per
 * row of its call, a run of such slots row by row; the others appear once per call (a
 * column there gives the call's first row). The first nkeyslots slots are KEYS: a
 * repeated one adds a key per row. One reply per call. rows = 1 is emq_evalsha_columns. */
int emq_evalsha_rows(emq_conn *c, const char *sha, size_t shalen, int64_t nkeyslots,
                     size_t nrows, size_t rows, size_t nslots, const char *slot_data,
                     const size_t *slot_lens, const int64_t *slot_col,
                     const int64_t *slot_each, size_t ncols, const char *col_data,
                     const size_t *col_lens, emq_replies *out);

/* CDEF-END */

#ifdef EMQ_INTERNAL
/* Shared by conn.c, resp.c, pipeline.c and bulk.c only; hiredis never leaks
 * into the cdef. */
#include <hiredis/hiredis.h>

struct emq_conn {
    redisContext *ctx; /* NULL while closed */
    char err[256];     /* last error, NUL-terminated, never holds credentials */
    void *tls;         /* the SSL of a TLS connection (freed with ctx), else NULL */
};

/* One write of up to len bytes, through TLS when the connection has it; like
 * send(2): bytes written, or -1 with errno (EAGAIN: none fit, with dontwait). */
ssize_t emq_conn_send(emq_conn *c, const char *buf, size_t len, int dontwait);

/* Record "<what>: <cause>" from the context (or errno) and close it. */
void emq_conn_fail(emq_conn *c, const char *what, int saved_errno);
#endif

#ifdef __cplusplus
}
#endif

#endif /* EMQ_H */
