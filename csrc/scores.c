/* scores.c - sorted-set score packing; the spec is emqfast/backends/pure.py.
 *
 * Python ints are unbounded and use floor semantics for >> and & on negative
 * values. The helpers below reproduce that on int64 without relying on the
 * implementation-defined right shift of negative signed values.
 */
#include "emq.h"

#define COUNTER_MASK 0xFFFFFFFFu

/* floor(v / 2**bits), like Python's v >> bits. */
static int64_t floor_shift(int64_t v, unsigned bits)
{
    return v >= 0 ? v >> bits : ~(~v >> bits);
}

/* v & mask with Python's infinite two's-complement semantics. */
static int64_t low_bits(int64_t v, uint64_t mask)
{
    return (int64_t)((uint64_t)v & mask);
}

int64_t emq_pack_delayed(int64_t run_at_ms, int64_t seq)
{
    if (run_at_ms < 0 || run_at_ms > EMQ_MAX_RUN_AT_MS)
        return -EMQ_ERANGE;
    /* Run-ats before the offset epoch are already due: clamp to offset 0. */
    int64_t offset = run_at_ms > EMQ_EPOCH_MS ? run_at_ms - EMQ_EPOCH_MS : 0;
    return (offset << EMQ_SEQ_BITS) | low_bits(seq, EMQ_SEQ_MASK);
}

emq_pair emq_unpack_delayed(int64_t score)
{
    emq_pair p;
    p.hi = EMQ_EPOCH_MS + floor_shift(score, EMQ_SEQ_BITS);
    p.lo = low_bits(score, EMQ_SEQ_MASK);
    return p;
}

int64_t emq_pack_priority(int64_t priority, int64_t counter)
{
    if (priority < 0 || priority > EMQ_PRIORITY_MAX)
        return -EMQ_ERANGE;
    return (priority << 32) + low_bits(counter, COUNTER_MASK);
}

emq_pair emq_unpack_priority(int64_t score)
{
    emq_pair p;
    p.hi = floor_shift(score, 32);
    p.lo = low_bits(score, COUNTER_MASK);
    return p;
}

int emq_pack_delayed_many(const int64_t *run_ats, const int64_t *seqs, size_t n,
                          int64_t *out, size_t *failed_at)
{
    for (size_t i = 0; i < n; i++) {
        int64_t s = emq_pack_delayed(run_ats[i], seqs[i]);
        if (s < 0) {
            *failed_at = i;
            return (int)-s;
        }
        out[i] = s;
    }
    return EMQ_OK;
}

int emq_pack_priority_many(const int64_t *priorities, const int64_t *counters, size_t n,
                           int64_t *out, size_t *failed_at)
{
    for (size_t i = 0; i < n; i++) {
        int64_t s = emq_pack_priority(priorities[i], counters[i]);
        if (s < 0) {
            *failed_at = i;
            return (int)-s;
        }
        out[i] = s;
    }
    return EMQ_OK;
}
