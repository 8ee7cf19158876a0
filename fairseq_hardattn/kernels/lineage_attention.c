/* Decoder self-attention of one beam-search step over caches that are never
 * reordered. Each step's keys and values stay where the hypothesis of that
 * step wrote them (time-major buffers: [position][row][head][dim]); a table
 * of ancestors says, for every hypothesis and earlier position, which row
 * its prefix's hypothesis had then. Beam search then moves integers (the
 * table's rows), not the caches: fairseq copies every cache twice per step
 * (the reorder and the concatenation).
 *
 * Per (hypothesis, head): soft attention (softmax of the scaled scores over
 * every position), hard retrieval (the value of the first position with the
 * largest unscaled score), or top-k (softmax of the scaled k largest unscaled
 * scores, ties: earlier position first). Rows and heads are independent.
 */
#include <math.h>
#include <stdint.h>

#include "sorted_insert.h"

enum { SOFT = 0, HARD = 1, TOPK = 2 };

static inline float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
    return sum;
}

static inline void add_scaled(float *out, const float *v, float w, int64_t n) {
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) out[d] += w * v[d];
}

/* q, out: (rows, heads, dim); keys, values: (capacity, rows0, heads, dim);
 * ancestors: (rows, >= length) with row stride anc_stride; positions
 * 0..length-1 are attended. Returns 0, or 1 where its scratch does not fit. */
int lineage_attention(const float *q, const float *keys, const float *values,
                      const int64_t *ancestors, int64_t anc_stride, int64_t rows, int64_t rows0,
                      int64_t heads, int64_t dim, int64_t length, float scale, int mode, int64_t k,
                      float *out) {
    if (length > 4096 || k > 64) return 1;
    float scores[length];
    int64_t kept[k > 0 ? k : 1];
    float kept_scores[k > 0 ? k : 1];
    const int64_t position_stride = rows0 * heads * dim;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t *anc = ancestors + r * anc_stride;
        for (int64_t h = 0; h < heads; ++h) {
            const float *query = q + (r * heads + h) * dim;
            float *o = out + (r * heads + h) * dim;
            for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
#define ROW(buffer, s) ((buffer) + (s) * position_stride + (anc[s] * heads + h) * dim)
            if (mode == HARD) {
                int64_t best = 0;
                float best_score = -INFINITY;
                for (int64_t s = 0; s < length; ++s) {
                    float score = dot(query, ROW(keys, s), dim);
                    if (score > best_score || s == 0) { best_score = score; best = s; }
                }
                add_scaled(o, ROW(values, best), 1.0f, dim);
                continue;
            }
            int64_t n = 0;
            if (mode == SOFT) {
                for (int64_t s = 0; s < length; ++s) scores[s] = dot(query, ROW(keys, s), dim) * scale;
                n = length;
            } else { /* TOPK: the k largest unscaled scores, descending, earlier first on ties */
                int64_t want = k < length ? k : length;
                for (int64_t s = 0; s < length; ++s) {
                    float score = dot(query, ROW(keys, s), dim);
                    if (n < want || score > kept_scores[want - 1])
                        sorted_insert(kept_scores, kept, &n, want, score, s);
                }
                for (int64_t j = 0; j < n; ++j) scores[j] = kept_scores[j] * scale;
            }
            float max = -INFINITY;
            for (int64_t j = 0; j < n; ++j) max = scores[j] > max ? scores[j] : max;
            float total = 0.0f;
            for (int64_t j = 0; j < n; ++j) {
                scores[j] = expf(scores[j] - max);
                total += scores[j];
            }
            for (int64_t j = 0; j < n; ++j) {
                int64_t s = mode == SOFT ? j : kept[j];
                add_scaled(o, ROW(values, s), scores[j] / total, dim);
            }
#undef ROW
        }
    }
    return 0;
}
