/* faiss_shim.cpp -- FAISS C++ calls the 1.7.3 C API lacks (faiss_shim.h). */
#include "faiss_shim.h"

#include <cstdio>
#include <exception>

#include <faiss/Index.h>
#include <faiss/IndexIVF.h>

static int shim_error(char *err, size_t errlen, const char *what)
{
    if (err && errlen)
        std::snprintf(err, errlen, "%s", what);
    return -1;
}

extern "C" int faiss_shim_search(const FaissIndex *idx, int64_t n, const float *x, int64_t k, int nprobe, float *d,
                                 int64_t *l, char *err, size_t errlen)
{
    try {
        const faiss::Index *ix = reinterpret_cast<const faiss::Index *>(idx);
        const faiss::IndexIVF *ivf = dynamic_cast<const faiss::IndexIVF *>(ix);
        if (ivf && nprobe > 0) {
            /* the parameters live on this call's stack: the index's own
             * nprobe is neither read nor written */
            faiss::SearchParametersIVF sp;
            sp.nprobe = (size_t)nprobe;
            sp.max_codes = ivf->max_codes;
            ix->search(n, x, k, d, reinterpret_cast<faiss::Index::idx_t *>(l), &sp);
        } else {
            ix->search(n, x, k, d, reinterpret_cast<faiss::Index::idx_t *>(l));
        }
    } catch (const std::exception &e) {
        return shim_error(err, errlen, e.what());
    } catch (...) {
        return shim_error(err, errlen, "unknown FAISS exception");
    }
    return 0;
}

extern "C" int faiss_shim_is_ivf(const FaissIndex *idx)
{
    return dynamic_cast<const faiss::IndexIVF *>(reinterpret_cast<const faiss::Index *>(idx)) != nullptr;
}
