/* PyTorch's float32 LayerNorm on a CPU, operation for operation, so that a
 * decoder step in C (decoder_sublayers.c's decoder_step) gives
 * F.layer_norm's bits: its moments (moments_utils.h's RowwiseMoments:
 * Welford per vector lane over chunks of 16 vectors, a cascade of chunks,
 * the lanes then the scalar tail combined) and its second pass
 * (layer_norm_kernel.cpp: (x - mean) * rstd * gamma + beta).
 *
 * Two facts of a PyTorch build are not in its source: the vector width its
 * LayerNorm kernel runs at (`lanes`: 8 for AVX2, 16 for AVX-512) and whether
 * its compiler fused a product and a sum into one rounding where the source
 * writes them apart (`fused`). The caller tries each pair against
 * F.layer_norm once per process and row size, and uses this kernel only
 * with a pair that gives its bits. Built without reassociation (see
 * kernels/__init__.py), so every sum here runs in the order written. */
#include <math.h>
#include <stdint.h>

#include "native.h"

enum { MAX_LANES = 16, CHUNK = 16, MAX_DEPTH = 64 };

/* moments_utils.h's AddMoments: (m0, m1, m2) += (m0_add, m1_add, m2_add) */
static void add_moments(int64_t m0_add, float m1_add, float m2_add, int64_t *m0, float *m1, float *m2,
                        int fused) {
    const int64_t n = *m0 + m0_add;
    const float c = n == 0 ? 0.0f : (float)m0_add / (float)n;
    const float delta = m1_add - *m1;
    if (fused) {
        *m1 = fmaf(c, delta, *m1);
        *m2 += fmaf(delta * delta * c, (float)*m0, m2_add);
    } else {
        *m1 += c * delta;
        *m2 += m2_add + delta * delta * c * (float)*m0;
    }
    *m0 = n;
}

/* AddMomentsVec: lanes of (m0_add, m1_add, m2_add) into lanes of (m0, m1, m2) */
static void add_moments_lanes(int64_t m0_add, const float *m1_add, const float *m2_add, int64_t *m0, float *m1,
                              float *m2, int lanes) {
    const int64_t n = *m0 + m0_add;
    const float c = n == 0 ? 0.0f : (float)m0_add / (float)n;
    for (int l = 0; l < lanes; ++l) {
        const float delta = m1_add[l] - m1[l];
        const float summed = m2[l] + m2_add[l];
        const float c_delta = c * delta;
        const float m0_delta = delta * (float)*m0;
        m1[l] = m1[l] + c_delta;
        m2[l] = fmaf(m0_delta, c_delta, summed);
    }
    *m0 = n;
}

/* RowwiseMoments: the mean and the (biased) variance of x[0..n) */
static void moments(const float *x, int64_t n, int lanes, int fused, float *mean, float *variance) {
    const int64_t vectors = n / lanes, chunks = (vectors + CHUNK - 1) / CHUNK;
    int64_t depth = 0;
    while (((int64_t)1 << depth) < chunks) ++depth;
    /* only the cascade's levels a row of n uses (at least one) start at zero: the whole
     * stack would be 8 KB set for each row */
    int64_t m0_stack[MAX_DEPTH];
    float m1_stack[MAX_DEPTH][MAX_LANES], m2_stack[MAX_DEPTH][MAX_LANES];
    for (int64_t level = 0; level < (depth > 0 ? depth : 1); ++level) {
        m0_stack[level] = 0;
        for (int l = 0; l < MAX_LANES; ++l) m1_stack[level][l] = m2_stack[level][l] = 0.0f;
    }
    for (int64_t i = 0; i < chunks; ++i) {
        const float *chunk = x + i * CHUNK * lanes;
        const int64_t m0 = vectors - i * CHUNK < CHUNK ? vectors - i * CHUNK : CHUNK;
        float m1[MAX_LANES] = {0}, m2[MAX_LANES] = {0};
        for (int64_t j = 0; j < m0; ++j) {
            const float c = 1.0f / (float)(j + 1);
            for (int l = 0; l < lanes; ++l) {
                const float value = chunk[j * lanes + l];
                const float delta = value - m1[l];
                m1[l] = fmaf(c, delta, m1[l]);
                m2[l] = fmaf(delta, value - m1[l], m2[l]);
            }
        }
        add_moments_lanes(m0, m1, m2, &m0_stack[0], m1_stack[0], m2_stack[0], lanes);
        int64_t mask = i + 1;
        for (int64_t j = 1; j < depth && (mask & 1) == 0; ++j) {
            add_moments_lanes(m0_stack[j - 1], m1_stack[j - 1], m2_stack[j - 1], &m0_stack[j], m1_stack[j],
                              m2_stack[j], lanes);
            m0_stack[j - 1] = 0;
            for (int l = 0; l < lanes; ++l) m1_stack[j - 1][l] = m2_stack[j - 1][l] = 0.0f;
            mask >>= 1;
        }
    }
    for (int64_t i = 1; i < depth; ++i)
        add_moments_lanes(m0_stack[i], m1_stack[i], m2_stack[i], &m0_stack[0], m1_stack[0], m2_stack[0], lanes);
    int64_t m0 = 0;
    float m1 = 0.0f, m2 = 0.0f;
    for (int64_t i = vectors * lanes; i < n; ++i) {
        const float value = x[i];
        const float delta = value - m1;
        ++m0;
        m1 += delta / (float)m0;
        m2 = fused ? fmaf(delta, value - m1, m2) : m2 + delta * (value - m1);
    }
    for (int l = 0; l < lanes; ++l) add_moments(vectors, m1_stack[0][l], m2_stack[0][l], &m0, &m1, &m2, fused);
    *mean = m1;
    *variance = m2 / (float)n;
}

/* y (rows, n) = F.layer_norm(x (rows, n), (n,), gamma, beta, eps); y may be x.
 * Returns 0, or 1 where `lanes` is not 8 or 16. */
int layer_norm(const float *x, int64_t rows, int64_t n, const float *gamma, const float *beta, float eps,
               struct fh_norm_variant variant, float *y) {
    const int lanes = variant.lanes, fused = variant.fused;
    if (lanes != 8 && lanes != 16) return 1;
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * n;
        float *out = y + r * n;
        float mean, variance;
        moments(row, n, lanes, fused, &mean, &variance);
        const float rstd = 1.0f / sqrtf(variance + eps), bias = -mean;
        for (int64_t j = 0; j < n; ++j) {
            const float scaled = (row[j] + bias) * rstd;
            out[j] = fused ? fmaf(scaled, gamma[j], beta[j]) : scaled * gamma[j] + beta[j];
        }
    }
    return 0;
}
