/* One beam-search step of decoder attention on a CPU, over keys and values
 * that stay where they were written: the encoder's, once per sentence
 * (cross-attention), the decoder's in lineage caches (self-attention), or
 * both as one attention (cross+self).
 *
 * Source part: keys and values of each sentence (any strides for sentence,
 * head and position; a row's dims contiguous), and the keys transposed in
 * blocks of 16 positions (soft and top-k take 16 scores at once as sums of
 * vectors, with no reduction per position); the hypotheses of a sentence
 * are consecutive rows (`group` each), and a table may say which of the
 * cached sentences each group reads (the search drops finished sentences
 * from its rows, not from the caches); padded positions are skipped.
 *
 * Lineage part: each step's keys and values stay where the hypothesis of
 * that step wrote them (time-major buffers: [position][row][head][dim]); a
 * table of ancestors says, for every hypothesis and earlier position, which
 * row its prefix's hypothesis had then. Beam search then moves integers (the
 * table's rows), not the caches: fairseq copies every cache twice per step
 * (the reorder and the concatenation). A position's heads are read together
 * (one contiguous block): the reads are scattered over the buffers, and
 * memory, not arithmetic, bounds this part.
 *
 * Per (hypothesis, head), over the source positions then the lineage ones:
 * soft attention (softmax of the scaled scores), hard retrieval (the value
 * of the first position with the largest unscaled score), or top-k (softmax
 * of the scaled k largest unscaled scores, ties: earlier position first), or
 * Luong's local-p attention (source only: the softmax of the scaled scores
 * of the positions s with |s - c| <= window around the head's centre c,
 * each weight then multiplied by exp(-(s - c)^2 / gaussian)). A row with no
 * position to attend to gets zeros. Rows are independent.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "exp_poly.h"
#include "native.h"
#include "parallel_rows.h"
#include "sorted_insert.h"

enum { SOFT = FH_MODE_SOFT, HARD = FH_MODE_HARD, TOPK = FH_MODE_TOPK, LOCAL = FH_MODE_LOCAL };
enum { MAX_K = FH_STEP_MAX_K, BLOCK = FH_SOURCE_BLOCK };

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

/* A group of at most HEAD_GROUP heads' unscaled scores over the source,
 * from the transposed keys of their sentence (heads, dim, blocks of BLOCK
 * positions): the heads' sums run side by side (independent chains of
 * additions), each position's in the order of its dims, as one head's alone. */
enum { HEAD_GROUP = 4 };
static inline __attribute__((always_inline)) void source_scores(const float *query, const float *keys_t,
                                                                int64_t first_head, int64_t group, int64_t dim,
                                                                int64_t blocks, int64_t src_len,
                                                                int64_t row_len, float *scores) {
    for (int64_t b = 0; b < blocks; ++b) {
        float sums[HEAD_GROUP][BLOCK] = {{0}};
        for (int64_t d = 0; d < dim; ++d) {
            for (int64_t g = 0; g < group; ++g) {
                const float qd = query[(first_head + g) * dim + d];
                const float *column = keys_t + (((first_head + g) * dim + d) * blocks + b) * BLOCK;
#pragma omp simd
                for (int64_t j = 0; j < BLOCK; ++j) sums[g][j] += qd * column[j];
            }
        }
        const int64_t end = (b + 1) * BLOCK < src_len ? BLOCK : src_len - b * BLOCK;
        for (int64_t g = 0; g < group; ++g)
            for (int64_t j = 0; j < end; ++j) scores[(first_head + g) * row_len + b * BLOCK + j] = sums[g][j];
    }
}

/* out += the sum over positions s with weight w[s] != 0 of w[s] times the
 * value at s: values + s * stride, through a lineage where `ancestors` is
 * given (+ ancestors[s] * row_stride). Position by position, as add_scaled
 * would, but summed in a local row, which the compiler keeps in registers
 * rather than storing and loading `out` at every position. */
enum { MAX_SUMMED_DIM = 128 };
static inline __attribute__((always_inline)) void weighted_values(float *out, const float *values, int64_t stride,
                                                                  const int64_t *ancestors, int64_t row_stride,
                                                                  const float *w, int64_t n, int64_t dim) {
#define VALUE_AT(s) (values + (s) * stride + (ancestors ? ancestors[s] * row_stride : 0))
    if (dim > MAX_SUMMED_DIM) {
        for (int64_t s = 0; s < n; ++s)
            if (w[s] != 0.0f) add_scaled(out, VALUE_AT(s), w[s], dim);
        return;
    }
    float sum[MAX_SUMMED_DIM];
    for (int64_t d = 0; d < dim; ++d) sum[d] = out[d];
    for (int64_t s = 0; s < n; ++s) {
        if (w[s] == 0.0f) continue;
        const float ws = w[s], *v = VALUE_AT(s);
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) sum[d] += ws * v[d];
    }
    for (int64_t d = 0; d < dim; ++d) out[d] = sum[d];
#undef VALUE_AT
}

/* A head's scores (`positions` of them, in a row of `row_len`, a whole
 * number of vectors) made its weights: soft attention's softmax of the
 * scaled scores, or top-k's over its k largest (earlier first on ties);
 * padded source positions (s < src_len) skipped; zeros where nothing is
 * left to attend to. */
static inline __attribute__((always_inline)) void row_weights(float *row, int64_t positions, int64_t row_len,
                                                              int64_t src_len, const uint8_t *padding, int mode,
                                                              int64_t k, float scale) {
    if (mode == TOPK) { /* the k largest, descending, earlier first on ties */
        int64_t kept[MAX_K];
        float kept_scores[MAX_K];
        int64_t n = 0, want = k < positions ? k : positions;
        for (int64_t s = 0; s < positions; ++s) {
            if (s < src_len && padding && padding[s]) continue;
            if (n < want || row[s] > kept_scores[want - 1]) sorted_insert(kept_scores, kept, &n, want, row[s], s);
        }
        for (int64_t s = 0; s < positions; ++s) row[s] = -INFINITY;
        for (int64_t j = 0; j < n; ++j) row[kept[j]] = kept_scores[j];
    }
    for (int64_t s = positions; s < row_len; ++s) row[s] = -INFINITY;
    float max = -INFINITY;
    for (int64_t s = 0; s < row_len; ++s) max = row[s] > max ? row[s] : max;
    if (max == -INFINITY) { /* nothing to attend to: zeros */
        for (int64_t s = 0; s < positions; ++s) row[s] = 0.0f;
        return;
    }
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t s = 0; s < row_len; ++s) {
        row[s] = exp_nonpositive((row[s] - max) * scale);
        total += row[s];
    }
    const float inverse = 1.0f / total;
#pragma omp simd
    for (int64_t s = 0; s < row_len; ++s) row[s] *= inverse;
}

#define STEP_PARAMETERS                                                                          \
    int64_t heads, int64_t dim, const float *src_keys, const float *src_keys_t,                   \
        const float *src_values, int64_t sentence_stride, int64_t head_stride,                    \
        int64_t src_position_stride, const uint8_t *src_padding, int64_t src_len, int64_t group, \
        const int64_t *src_sentences, const float *keys, const float *values,                     \
        const int64_t *ancestors, int64_t anc_stride, int64_t rows0, int64_t length, float scale, \
        int mode, int64_t k, const float *centres, float window, float gaussian, float *out
#define STEP_ARGUMENTS                                                                            \
    heads, dim, src_keys, src_keys_t, src_values, sentence_stride, head_stride,                \
        src_position_stride, src_padding, src_len, group, src_sentences, keys, values, ancestors, \
        anc_stride, rows0, length, scale, mode, k, centres, window, gaussian, out

/* Rows [first, end) of the step (see step_attention); returns 0, or 2 where
 * its scratch could not be allocated. Inlined into attend_rows for each
 * head size it names. */
static inline __attribute__((always_inline)) int attend_rows_body(int64_t first, int64_t end,
                                                                   const float *q, STEP_PARAMETERS) {
    const int64_t positions = src_len + length;
    /* a head's row rounded up to whole vectors, -inf beyond `positions`: the
     * softmax's loops then run in vectors only (a short row would otherwise
     * run entirely in the vectorised loop's scalar remainder) */
    const int64_t row_len = (positions + BLOCK - 1) / BLOCK * BLOCK;
    float *scores = malloc(heads * row_len * sizeof *scores); /* [head][position]: scores, then weights */
    if (!scores) return 2;
    const int64_t position_stride = rows0 * heads * dim, block = heads * dim;
    const int64_t src_blocks = (src_len + BLOCK - 1) / BLOCK;
    for (int64_t r = first; r < end; ++r) {
        const float *query = q + r * block;
        float *o = out + r * block;
        const int64_t *anc = ancestors ? ancestors + r * anc_stride : 0;
        const int64_t sentence = !src_len ? 0 : src_sentences ? src_sentences[r / group] : r / group;
        const uint8_t *padding = src_padding ? src_padding + sentence * src_len : 0;
        const float *sentence_keys = src_len ? src_keys + sentence * sentence_stride : 0;
        const float *sentence_values = src_len ? src_values + sentence * sentence_stride : 0;
        for (int64_t d = 0; d < block; ++d) o[d] = 0.0f;
        if (mode == LOCAL) { /* per head, a window around its centre */
            for (int64_t h = 0; h < heads; ++h) {
                const float *head_query = query + h * dim;
                const float *head_keys = sentence_keys + h * head_stride;
                const float *head_values = sentence_values + h * head_stride;
                const float centre = centres[r * heads + h];
                float *row = scores + h * row_len;
                /* the window, a position wider each side: |s - c| <= window decides */
                int64_t first = (int64_t)floorf(centre - window) - 1, last = (int64_t)ceilf(centre + window) + 1;
                first = first < 0 ? 0 : first;
                last = last > src_len - 1 ? src_len - 1 : last;
                float max = -INFINITY;
                for (int64_t s = first; s <= last; ++s) {
                    row[s] = -INFINITY;
                    if (fabsf((float)s - centre) > window || (padding && padding[s])) continue;
                    row[s] = dot(head_query, head_keys + s * src_position_stride, dim) * scale;
                    max = row[s] > max ? row[s] : max;
                }
                if (max == -INFINITY) continue;
                float total = 0.0f;
                for (int64_t s = first; s <= last; ++s) {
                    row[s] = exp_nonpositive(row[s] - max);
                    total += row[s];
                }
                for (int64_t s = first; s <= last; ++s) {
                    if (row[s] == 0.0f) continue;
                    const float distance = (float)s - centre;
                    const float w = row[s] / total * exp_nonpositive(-(distance * distance) / gaussian);
                    add_scaled(o + h * dim, head_values + s * src_position_stride, w, dim);
                }
            }
            continue;
        }
        if (mode == HARD) { /* per head, the first position with the largest score */
            for (int64_t h = 0; h < heads; ++h) {
                const float *head_query = query + h * dim;
                const float *head_keys = sentence_keys + h * head_stride;
                const float *chosen = 0;
                float best_score = -INFINITY;
                for (int64_t s = 0; s < src_len; ++s) {
                    if (padding && padding[s]) continue;
                    const float *key = head_keys + s * src_position_stride;
                    const float score = dot(head_query, key, dim);
                    if (!chosen || score > best_score) {
                        best_score = score;
                        chosen = sentence_values + h * head_stride + s * src_position_stride;
                    }
                }
                for (int64_t t = 0; t < length; ++t) {
                    const int64_t at = t * position_stride + anc[t] * block + h * dim;
                    const float score = dot(head_query, keys + at, dim);
                    if (!chosen || score > best_score) { best_score = score; chosen = values + at; }
                }
                if (chosen) add_scaled(o + h * dim, chosen, 1.0f, dim);
            }
            continue;
        }
        /* unscaled scores; padded source positions -inf. Soft and top-k read
         * the transposed keys: 16 positions' scores as one vector, summed
         * over dims, no reduction per position */
        if (src_len) {
            const float *sentence_keys_t = src_keys_t + sentence * heads * dim * src_blocks * BLOCK;
            int64_t h = 0; /* whole groups, their size a constant (their sums then stay in registers), then the rest */
            for (; h + HEAD_GROUP <= heads; h += HEAD_GROUP)
                source_scores(query, sentence_keys_t, h, HEAD_GROUP, dim, src_blocks, src_len, row_len, scores);
            if (h < heads)
                source_scores(query, sentence_keys_t, h, heads - h, dim, src_blocks, src_len, row_len, scores);
            if (padding)
                for (int64_t hh = 0; hh < heads; ++hh)
                    for (int64_t s = 0; s < src_len; ++s)
                        if (padding[s]) scores[hh * row_len + s] = -INFINITY;
        }
        for (int64_t t = 0; t < length; ++t) {
            const float *at = keys + t * position_stride + anc[t] * block;
            for (int64_t h = 0; h < heads; ++h)
                scores[h * row_len + src_len + t] = dot(query + h * dim, at + h * dim, dim);
        }
        /* per head: the weights over positions */
        for (int64_t h = 0; h < heads; ++h)
            row_weights(scores + h * row_len, positions, row_len, src_len, padding, mode, k, scale);
        /* the weighted values */
        for (int64_t h = 0; h < heads && src_len; ++h) {
            const float *row = scores + h * row_len;
            const float *head_values = sentence_values + h * head_stride;
            weighted_values(o + h * dim, head_values, src_position_stride, 0, 0, row, src_len, dim);
        }
        for (int64_t h = 0; h < heads && length; ++h)
            weighted_values(o + h * dim, values + h * dim, position_stride, anc, block,
                            scores + h * row_len + src_len, length, dim);
    }
    free(scores);
    return 0;
}

/* The presets' head sizes (32: small, 64: Base) as constants, so that the
 * compiler unrolls each dot product and scaled add: the same sums in the
 * same order, without a loop's set-up for each head and position. */
#define WITH_DIM(D) { const int64_t dim = (D); return attend_rows_body(first, end, q, STEP_ARGUMENTS); }
static int attend_rows(int64_t first, int64_t end, const float *q, STEP_PARAMETERS) {
    if (dim == 32) WITH_DIM(32)
    if (dim == 64) WITH_DIM(64)
    return attend_rows_body(first, end, q, STEP_ARGUMENTS);
}
#undef WITH_DIM

/* The threads a step of `rows` rows over `positions` positions runs on. */
int step_attention_threads(int64_t rows, int64_t heads, int64_t dim, int64_t positions) {
    return row_threads(rows, 4, (double)heads * dim * positions);
}

/* (native.h) Rows are split over the caller's OpenMP threads
 * (parallel_rows.h); a row's sums run in the same order on any thread. */
int step_attention(const float *q, int64_t rows, int64_t heads, int64_t dim, const struct fh_source *source,
                   const struct fh_lineage *lineage, const struct fh_attending *attending, float *out) {
    static const struct fh_source no_source;
    static const struct fh_lineage no_lineage;
    if (!source) source = &no_source;
    if (!lineage) lineage = &no_lineage;
    const float *src_keys = source->keys, *src_keys_t = source->keys_t, *src_values = source->values;
    const int64_t sentence_stride = source->sentence_stride, head_stride = source->head_stride;
    const int64_t src_position_stride = source->position_stride, src_len = source->len, group = source->group;
    const uint8_t *src_padding = source->padding;
    const int64_t *src_sentences = source->sentences;
    const float *keys = lineage->keys, *values = lineage->values;
    const int64_t *ancestors = lineage->ancestors;
    const int64_t anc_stride = lineage->anc_stride, rows0 = lineage->rows0, length = lineage->length;
    const float scale = attending->scale, window = attending->window, gaussian = attending->gaussian;
    const int mode = attending->mode;
    const int64_t k = attending->k;
    const float *centres = attending->centres;
    if (src_len + length < 1 || k > MAX_K) return 1;
    const int threads = step_attention_threads(rows, heads, dim, src_len + length);
    if (threads == 1) return attend_rows(0, rows, q, STEP_ARGUMENTS);
    int status = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(max : status)
    {
        int64_t first, end;
        row_share(rows, omp_get_thread_num(), omp_get_num_threads(), &first, &end);
        status = attend_rows(first, end, q, STEP_ARGUMENTS);
    }
#endif
    return status;
}
