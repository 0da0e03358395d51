/* backoff.c - retry delays with deterministic jitter; the spec is
 * emqfast/backends/pure.py (backoff_delay).
 *
 * Everything is exact 64-bit arithmetic. Inputs where Python's unbounded ints
 * would leave int64 (base/cap above 2**62, band above 1, a jittered delay
 * that leaves [0, 2**63)) are reported as EMQ_EDOMAIN rather than computed
 * approximately; the wrapper then asks the reference implementation.
 */
#include "emq.h"

#define GOLDEN 0x9E3779B97F4A7C15ull
#define ATTEMPT_MIX 0xD1B54A32D192ED03ull

static uint64_t splitmix_next(uint64_t *state)
{
    uint64_t z = (*state += GOLDEN);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

emq_splitmix emq_splitmix64(uint64_t state)
{
    emq_splitmix r;
    r.output = splitmix_next(&state);
    r.state = state;
    return r;
}

static int in_budget(int64_t ms)
{
    return ms >= 0 && ms <= EMQ_BACKOFF_MAX_MS;
}

int64_t emq_backoff_delay(int kind, int64_t base_ms, int64_t cap_ms, double band, int full,
                          uint64_t attempts, uint64_t seed)
{
    int64_t d;
    if (attempts < 1)
        return -EMQ_ERANGE;
    if (!in_budget(base_ms))
        return -EMQ_EDOMAIN;
    if (kind == EMQ_KIND_FIXED) {
        d = base_ms; /* the cap is not consulted, so it is not checked either */
    } else {
        if (!in_budget(cap_ms))
            return -EMQ_EDOMAIN;
        uint64_t shift = attempts - 1;
        /* base << shift > cap  <=>  base > cap >> shift; never shifts past 62 */
        if (shift >= 63 || base_ms > (cap_ms >> shift)) {
            d = cap_ms;
        } else {
            int64_t grown = base_ms << shift;
            d = grown < cap_ms ? grown : cap_ms;
        }
    }

    uint64_t state = seed ^ (attempts * ATTEMPT_MIX);
    if (band > 0.0 && d > 0) {
        if (!(band <= 1.0))
            return -EMQ_EDOMAIN;
        /* Python's int * float: the int is rounded to double, then an IEEE
         * multiply; int() truncates. d <= 2**62 and band <= 1 keep w in range. */
        int64_t w = (int64_t)((double)d * band);
        if (w > 0) {
            uint64_t rem = splitmix_next(&state) % (2 * (uint64_t)w + 1);
            int64_t lo = d - w; /* may dip below 0: double(d) can round up */
            if (lo < 0) {
                if (rem < (uint64_t)-lo)
                    return -EMQ_EDOMAIN;
                d = (int64_t)(rem - (uint64_t)-lo);
            } else {
                if (rem > (uint64_t)INT64_MAX - (uint64_t)lo)
                    return -EMQ_EDOMAIN;
                d = lo + (int64_t)rem;
            }
        }
    }
    if (full)
        d = (int64_t)(splitmix_next(&state) % ((uint64_t)d + 1));
    return d;
}

int emq_backoff_delay_many(int kind, int64_t base_ms, int64_t cap_ms, double band, int full,
                           const uint64_t *attempts, const uint64_t *seeds, size_t n,
                           int64_t *out, size_t *failed_at)
{
    for (size_t i = 0; i < n; i++) {
        int64_t d = emq_backoff_delay(kind, base_ms, cap_ms, band, full, attempts[i], seeds[i]);
        if (d < 0) {
            *failed_at = i;
            return (int)-d;
        }
        out[i] = d;
    }
    return EMQ_OK;
}
