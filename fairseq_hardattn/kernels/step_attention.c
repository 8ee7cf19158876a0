/* One beam-search step of decoder attention on a CPU, over keys and values
 * that stay where they were written: the encoder's, once per sentence
 * (cross-attention), the decoder's in lineage caches (self-attention), or
 * both as one attention (cross+self).
 *
 * Source part: keys and values of each sentence (any strides for sentence,
 * head and position; the head's dims contiguous), the hypotheses of a
 * sentence consecutive rows (`group` each), padded positions skipped.
 *
 * Lineage part: each step's keys and values stay where the hypothesis of
 * that step wrote them (time-major buffers: [position][row][head][dim]); a
 * table of ancestors says, for every hypothesis and earlier position, which
 * row its prefix's hypothesis had then. Beam search then moves integers (the
 * table's rows), not the caches: fairseq copies every cache twice per step
 * (the reorder and the concatenation).
 *
 * Per (hypothesis, head), over the source positions then the lineage ones:
 * soft attention (softmax of the scaled scores), hard retrieval (the value
 * of the first position with the largest unscaled score), or top-k (softmax
 * of the scaled k largest unscaled scores, ties: earlier position first). A
 * row with no position to attend to gets zeros. Rows and heads are
 * independent.
 */
#include <math.h>
#include <stdint.h>

#include "sorted_insert.h"

enum { SOFT = 0, HARD = 1, TOPK = 2 };
enum { MAX_POSITIONS = 8192, MAX_K = 64 };

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

/* q, out: (rows, heads, dim).
 * Source (src_len > 0): src_keys, src_values with strides sentence_stride,
 * head_stride and src_position_stride in floats; src_padding (sentences, src_len)
 * bytes, nonzero where padded, or NULL; row r reads sentence r / group.
 * Lineage (length > 0): keys, values (capacity, rows0, heads, dim);
 * ancestors (rows, >= length) with row stride anc_stride.
 * Returns 0, or 1 where its scratch does not fit. */
int step_attention(const float *q, int64_t rows, int64_t heads, int64_t dim,
                   const float *src_keys, const float *src_values, int64_t sentence_stride,
                   int64_t head_stride, int64_t src_position_stride,
                   const uint8_t *src_padding, int64_t src_len, int64_t group,
                   const float *keys, const float *values, const int64_t *ancestors,
                   int64_t anc_stride, int64_t rows0, int64_t length,
                   float scale, int mode, int64_t k, float *out) {
    const int64_t positions = src_len + length;
    if (positions > MAX_POSITIONS || positions < 1 || k > MAX_K) return 1;
    float scores[positions];
    int64_t kept[MAX_K];
    float kept_scores[MAX_K];
    const int64_t position_stride = rows0 * heads * dim;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t *anc = ancestors ? ancestors + r * anc_stride : 0;
        const int64_t sentence = src_len ? r / group : 0;
        const uint8_t *padding = src_padding ? src_padding + sentence * src_len : 0;
        for (int64_t h = 0; h < heads; ++h) {
            const float *query = q + (r * heads + h) * dim;
            float *o = out + (r * heads + h) * dim;
            for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
            const int64_t src_offset = src_len ? sentence * sentence_stride + h * head_stride : 0;
/* position s of the joint sequence: source positions first, then lineage ones */
#define ROW(source, lineage, s) ((s) < src_len                                          \
        ? (source) + src_offset + (s) * src_position_stride                                   \
        : (lineage) + ((s) - src_len) * position_stride + (anc[(s) - src_len] * heads + h) * dim)
#define VISIBLE(s) (!((s) < src_len && padding && padding[s]))
            int64_t n = 0;
            if (mode == HARD) {
                int64_t best = -1;
                float best_score = -INFINITY;
                for (int64_t s = 0; s < positions; ++s) {
                    if (!VISIBLE(s)) continue;
                    float score = dot(query, ROW(src_keys, keys, s), dim);
                    if (best < 0 || score > best_score) { best_score = score; best = s; }
                }
                if (best >= 0) add_scaled(o, ROW(src_values, values, best), 1.0f, dim);
                continue;
            }
            if (mode == SOFT) {
                for (int64_t s = 0; s < positions; ++s)
                    if (VISIBLE(s)) {
                        scores[s] = dot(query, ROW(src_keys, keys, s), dim) * scale;
                        ++n;
                    } else {
                        scores[s] = -INFINITY;
                    }
                if (n == 0) continue;
                n = positions;
            } else { /* TOPK: the k largest unscaled scores, descending, earlier first on ties */
                int64_t want = k < positions ? k : positions;
                for (int64_t s = 0; s < positions; ++s) {
                    if (!VISIBLE(s)) continue;
                    float score = dot(query, ROW(src_keys, keys, s), dim);
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
                if (scores[j] != 0.0f) add_scaled(o, ROW(src_values, values, s), scores[j] / total, dim);
            }
#undef VISIBLE
#undef ROW
        }
    }
    return 0;
}
