/* rng.c -- seeding of the xoshiro256** generator. */
#include "rng.h"
#include "nc_common.h"

void rng_seed(nc_rng *r, uint64_t seed)
{
    NC_ASSERT(r, "rng_seed: no r");
    /* splitmix64: the seeding procedure recommended by xoshiro's authors. */
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        r->s[i] = z ^ (z >> 31);
    }
}
