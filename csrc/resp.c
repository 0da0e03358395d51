/* resp.c: growable buffers, RESP framing and reply flattening shared by the
 * pipelined (pipeline.c) and streamed (bulk.c) EVALSHA batches. */
#include "resp.h"

#include <stdlib.h>
#include <string.h>

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
