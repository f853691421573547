/* mix_input.c -- what the components' rows read of p_vocab at one position. */
#include "mix_input.h"

#include <cblas.h>

double mix_vocab_logp(const nc_mix_input *in, int w)
{
    NC_ASSERT(in, "mix_vocab_logp: no in");
    if (w < 0 || w >= in->V)
        return NC_LOGP_FLOOR;
    double s;
    if (in->logits)
        s = in->logits[w];
    else if (in->h && in->dec_w)
        s = (double)cblas_sdot(in->H, in->dec_w + (size_t)w * in->H, 1, in->h, 1) + (in->dec_b ? in->dec_b[w] : 0.0f);
    else
        return 0.0;
    double lp = s - in->log_z;
    return lp > NC_LOGP_FLOOR ? lp : NC_LOGP_FLOOR;
}
