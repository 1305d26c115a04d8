/*
 * faiss_bridge.cpp: the engine's only contact with FAISS (DESIGN.md section 8). Debian ships
 * FAISS as a static C++ library without its C API, so this file wraps the two things the index
 * needs, spherical k-means and exact inner-product search, behind the C functions of kmeans.h.
 *
 * Every FAISS call sits inside a try block: no C++ exception may unwind through C frames, so
 * each one becomes -1 and a message in err. Arguments are checked before FAISS sees them,
 * because some FAISS checks are assertions that abort rather than throw.
 */
#include "kmeans.h"

#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <faiss/impl/FaissException.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

namespace
{

void set_err(char *err, size_t errlen, const char *what, const char *detail)
{
    if (err == nullptr || errlen == 0)
        return;
    if (detail != nullptr && detail[0] != '\0')
        std::snprintf(err, errlen, "%s: %s", what, detail);
    else
        std::snprintf(err, errlen, "%s", what);
}

/* FAISS takes int dimensions and counts; anything larger must be refused here. */
bool fits_int(size_t v)
{
    return v <= (size_t)std::numeric_limits<int>::max();
}

/* ClusteringParameters::seed is an int: fold the 64-bit seed so that both halves count. */
int fold_seed(uint64_t seed)
{
    uint64_t s = seed ^ (seed >> 32);
    return (int)(uint32_t)(s & 0x7fffffffu);
}

void normalise_rows(float *x, size_t n, size_t dim)
{
    for (size_t i = 0; i < n; i++) {
        float *r = x + i * dim;
        double s = 0.0;
        for (size_t j = 0; j < dim; j++)
            s += (double)r[j] * r[j];
        /* A zero centroid cannot happen with FAISS's empty-cluster splitting on non-zero
         * inputs; if it does, leave it zero rather than divide by zero. */
        if (s > 0.0) {
            float inv = (float)(1.0 / std::sqrt(s));
            for (size_t j = 0; j < dim; j++)
                r[j] *= inv;
        }
    }
}

} // namespace

extern "C" int idx_kmeans_spherical(const float *x, size_t n, size_t dim, size_t k, int niter,
                                    int max_per_centroid, uint64_t seed, float *centroids,
                                    char *err, size_t errlen)
{
    if (x == nullptr || centroids == nullptr) {
        set_err(err, errlen, "k-means: NULL input or output", nullptr);
        return -1;
    }
    if (n == 0 || dim == 0 || k == 0) {
        set_err(err, errlen, "k-means: empty input (n, dim and k must be positive)", nullptr);
        return -1;
    }
    /* k > n is an error, not a clamp: the caller sized centroids for k rows and sized the
     * codes for k; a silent clamp would leave rows undefined. The caller (the index builder)
     * clamps k to its training set before calling. */
    if (k > n) {
        char d[96];
        std::snprintf(d, sizeof d, "%zu centroids requested from only %zu training vectors", k, n);
        set_err(err, errlen, "k-means", d);
        return -1;
    }
    if (!fits_int(dim) || !fits_int(k)) {
        set_err(err, errlen, "k-means: dim or k too large for FAISS", nullptr);
        return -1;
    }
    if (niter <= 0 || max_per_centroid <= 0) {
        set_err(err, errlen, "k-means: niter and max_per_centroid must be positive", nullptr);
        return -1;
    }
    try {
        faiss::ClusteringParameters cp;
        cp.niter = niter;
        cp.nredo = 1;
        cp.verbose = false;
        cp.spherical = true;
        cp.max_points_per_centroid = max_per_centroid;
        /* FAISS prints a warning to stderr below min_points_per_centroid * k points; the
         * library never prints, and a small corpus is the caller's choice. */
        cp.min_points_per_centroid = 1;
        cp.seed = fold_seed(seed);
        faiss::Clustering clus((int)dim, (int)k, cp);
        /* Assignment by inner product: with spherical centroids this is cosine k-means. */
        faiss::IndexFlatIP assign((faiss::Index::idx_t)dim);
        clus.train((faiss::Index::idx_t)n, x, assign);
        if (clus.centroids.size() != k * dim) {
            set_err(err, errlen, "k-means: FAISS returned a centroid table of the wrong size",
                    nullptr);
            return -1;
        }
        std::memcpy(centroids, clus.centroids.data(), k * dim * sizeof(float));
        /* FAISS skips its spherical normalisation when n == k (it copies the points) and
         * normalises in float; normalise once more so the contract holds in every case. */
        normalise_rows(centroids, k, dim);
    } catch (const faiss::FaissException &e) {
        set_err(err, errlen, "k-means (FAISS)", e.what());
        return -1;
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, "k-means: out of memory", nullptr);
        return -1;
    } catch (const std::exception &e) {
        set_err(err, errlen, "k-means", e.what());
        return -1;
    } catch (...) {
        set_err(err, errlen, "k-means: unknown C++ exception", nullptr);
        return -1;
    }
    return 0;
}

extern "C" int idx_flat_ip_search(const float *centroids, size_t k, size_t dim, const float *x,
                                  size_t n, size_t topn, int64_t *labels, float *scores, char *err,
                                  size_t errlen)
{
    if (centroids == nullptr || (x == nullptr && n > 0)) {
        set_err(err, errlen, "flat search: NULL input", nullptr);
        return -1;
    }
    if (k == 0 || dim == 0 || topn == 0) {
        set_err(err, errlen, "flat search: k, dim and topn must be positive", nullptr);
        return -1;
    }
    if (!fits_int(dim) || !fits_int(topn)) {
        set_err(err, errlen, "flat search: dim or topn too large for FAISS", nullptr);
        return -1;
    }
    if (n == 0)
        return 0;
    if (n > std::numeric_limits<size_t>::max() / topn) {
        set_err(err, errlen, "flat search: n * topn overflows", nullptr);
        return -1;
    }
    try {
        std::vector<faiss::Index::idx_t> own_labels;
        std::vector<float> own_scores;
        faiss::Index::idx_t *lab;
        float *sc;
        /* faiss::Index::idx_t is int64_t on every platform FAISS supports; copy otherwise. */
        if (labels != nullptr && sizeof(faiss::Index::idx_t) == sizeof(int64_t)) {
            lab = reinterpret_cast<faiss::Index::idx_t *>(labels);
        } else {
            own_labels.resize(n * topn);
            lab = own_labels.data();
        }
        if (scores != nullptr) {
            sc = scores;
        } else {
            own_scores.resize(n * topn);
            sc = own_scores.data();
        }
        faiss::IndexFlatIP index((faiss::Index::idx_t)dim);
        index.add((faiss::Index::idx_t)k, centroids);
        index.search((faiss::Index::idx_t)n, x, (faiss::Index::idx_t)topn, sc, lab);
        /* With topn > k FAISS pads with label -1; give those slots a score of -inf so that
         * no caller mistakes the pad for a real centroid. */
        for (size_t i = 0; i < n * topn; i++)
            if (lab[i] < 0)
                sc[i] = -std::numeric_limits<float>::infinity();
        if (labels != nullptr && lab != reinterpret_cast<faiss::Index::idx_t *>(labels))
            for (size_t i = 0; i < n * topn; i++)
                labels[i] = (int64_t)lab[i];
    } catch (const faiss::FaissException &e) {
        set_err(err, errlen, "flat search (FAISS)", e.what());
        return -1;
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, "flat search: out of memory", nullptr);
        return -1;
    } catch (const std::exception &e) {
        set_err(err, errlen, "flat search", e.what());
        return -1;
    } catch (...) {
        set_err(err, errlen, "flat search: unknown C++ exception", nullptr);
        return -1;
    }
    return 0;
}
