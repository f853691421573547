/* rng.h -- small deterministic random number generator (xoshiro256**).
 *
 * Training needs a generator whose whole state can be checkpointed and
 * restored bit for bit, and whose stream does not depend on the C library:
 * xoshiro256** (Blackman & Vigna, 2018), seeded through splitmix64. */
#ifndef NC_RNG_H
#define NC_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} nc_rng;

/* Seeds the four state words from one 64-bit seed (splitmix64), so that
 * nearby seeds give unrelated streams. */
void rng_seed(nc_rng *r, uint64_t seed);

static inline uint64_t rng_rotl_(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t rng_next(nc_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rng_rotl_(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl_(s[3], 45);
    return result;
}

/* Uniform float in [0, 1) with 24 random bits. */
static inline float rng_uniform(nc_rng *r)
{
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

#endif
