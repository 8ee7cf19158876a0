/* The plugin's beam search, per step: for every hypothesis (row of logits),
 * the log-normaliser of its raw logits and its best K tokens, where a few
 * special columns (pad, unk, EOS) count with an adjusted value (-inf: never
 * chosen; unk's penalty) in the choice but with their raw value in the
 * normaliser, as fairseq's generator applies them to the log-probabilities.
 *
 * Per row: the maximum of every block of 64 logits (vectorised); the K-th
 * largest block maximum bounds the K-th largest logit from below, so only
 * the blocks reaching it are looked at, 16 logits at a time (a group whose
 * maximum cannot enter the top K is passed over), for the top K; then the sum
 * of exp(x - max) with a polynomial exp the compiler vectorises (relative
 * error ~2e-7 per term; the normaliser to ~1e-6).
 *
 * Ties keep the lower token index first. Rows are independent (no scratch
 * memory), split over the caller's OpenMP threads (parallel_rows.h); the
 * caller guarantees 1 <= K <= vocab.
 *
 * Also the search's other per-step passes: an ensemble's log-probabilities
 * (ensemble_log_probs), and each finished hypothesis read back along the
 * back-pointers (read_back).
 */
#include <math.h>
#include <stdint.h>

#include "exp_poly.h"
#include "native.h"
#include "parallel_rows.h"
#include "sorted_insert.h"

#define BLOCK 64
#define GROUP 16 /* logits at a time in a scanned block */

static float sum_exp(const float *x, int64_t n, float max) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
        float y = (x[j] - max) * 1.4426950408889634f;
        y = y < -126.0f ? -126.0f : y;
        sum += exp2_poly(y);
    }
    return sum;
}

static inline int is_special(int64_t col, const int64_t *cols, int64_t nspecial) {
    for (int64_t s = 0; s < nspecial; ++s)
        if (cols[s] == col) return 1;
    return 0;
}

static inline int has_special(int64_t start, int64_t width, const int64_t *cols, int64_t nspecial) {
    int found = 0;
    for (int64_t s = 0; s < nspecial; ++s) found |= cols[s] >= start && cols[s] < start + width;
    return found;
}

static float max_of(const float *x, int64_t n) {
    float max = -INFINITY;
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < n; ++j) max = x[j] > max ? x[j] : max;
    return max;
}

/* Rows [first, end) of beam_candidates. */
static void candidate_rows(int64_t first, int64_t end, const float *logits, int64_t vocab,
                           int64_t stride, const int64_t *cols, const float *adds, int64_t nspecial,
                           int64_t k, float *top_vals, int64_t *top_idx, float *lse) {
    int64_t blocks = (vocab + BLOCK - 1) / BLOCK;
    float block_max[blocks], best_blocks[k];
    for (int64_t r = first; r < end; ++r) {
        const float *x = logits + r * stride;
        float *vals = top_vals + r * k;
        int64_t *idx = top_idx + r * k;
        /* every block's maximum; the k-th largest of them bounds the k-th
         * largest logit from below, so only blocks reaching it are scanned */
        float max = -INFINITY;
        int64_t counted = 0;
        for (int64_t b = 0; b < blocks; ++b) {
            int64_t start = b * BLOCK, width = start + BLOCK < vocab ? BLOCK : vocab - start;
            float m = max_of(x + start, width);
            block_max[b] = m;
            max = m > max ? m : max;
            if (has_special(start, width, cols, nspecial))
                continue; /* its maximum may be a special column's: no bound from it */
            if (counted < k || m > best_blocks[k - 1]) {
                int64_t at = counted < k ? counted : k - 1;
                while (at > 0 && best_blocks[at - 1] < m) {
                    best_blocks[at] = best_blocks[at - 1];
                    --at;
                }
                best_blocks[at] = m;
                if (counted < k) ++counted;
            }
        }
        float bound = counted == k ? best_blocks[k - 1] : -INFINITY;
        int64_t count = 0;
        for (int64_t b = 0; b < blocks; ++b) {
            int64_t start = b * BLOCK, width = start + BLOCK < vocab ? BLOCK : vocab - start;
            int special = has_special(start, width, cols, nspecial);
            if (!special && block_max[b] < bound)
                continue;
            /* by GROUP logits: a group whose maximum does not beat the k-th
             * best kept is skipped, and a logit below the bound is never kept */
            for (int64_t group = start; group < start + width; group += GROUP) {
                const int64_t end_group = group + GROUP < start + width ? group + GROUP : start + width;
                if (count == k && max_of(x + group, end_group - group) <= vals[k - 1])
                    continue;
                for (int64_t j = group; j < end_group; ++j) {
                    if (x[j] < bound || (special && is_special(j, cols, nspecial))) continue;
                    if (count < k || x[j] > vals[k - 1]) sorted_insert(vals, idx, &count, k, x[j], j);
                }
            }
        }
        for (int64_t s = 0; s < nspecial; ++s) {
            float value = isnan(adds[s]) ? -INFINITY : x[cols[s]] + adds[s];
            if (count < k || value > vals[k - 1]) {
                /* after any equal value of a lower index: find its place by index too */
                int64_t at = count < k ? count : k - 1;
                while (at > 0 && (vals[at - 1] < value || (vals[at - 1] == value && idx[at - 1] > cols[s]))) {
                    vals[at] = vals[at - 1];
                    idx[at] = idx[at - 1];
                    --at;
                }
                vals[at] = value;
                idx[at] = cols[s];
                if (count < k) ++count;
            }
        }
        lse[r] = max + logf(sum_exp(x, vocab, max));
    }
}

/* logits: rows x vocab (row stride `stride`); cols/adds: the special columns
 * and what their value is for the choice (NAN: -inf); out: top_vals,
 * top_idx (rows x k), lse (rows) */
void beam_candidates(const float *logits, int64_t rows, int64_t vocab, int64_t stride,
                     const int64_t *cols, const float *adds, int64_t nspecial, int64_t k,
                     float *top_vals, int64_t *top_idx, float *lse) {
    const int threads = row_threads(rows, 4, (double)vocab);
    if (threads == 1) {
        candidate_rows(0, rows, logits, vocab, stride, cols, adds, nspecial, k, top_vals, top_idx, lse);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    {
        int64_t first, end;
        row_share(rows, omp_get_thread_num(), omp_get_num_threads(), &first, &end);
        candidate_rows(first, end, logits, vocab, stride, cols, adds, nspecial, k, top_vals, top_idx, lse);
    }
#endif
}

/* ln(v) for v >= 1 (v = 2^e f, f in [1, 2): e ln 2 + 2 atanh((f-1)/(f+1)) as
 * its odd series to s^13, s <= 1/3: relative error ~1e-7), in a form the
 * compiler vectorises */
static inline float log_at_least_one(float v) {
    int32_t bits;
    memcpy(&bits, &v, sizeof bits);
    const int32_t e = ((bits >> 23) & 0xff) - 127;
    bits = (bits & 0x007fffff) | 0x3f800000;
    float f;
    memcpy(&f, &bits, sizeof f);
    const float s = (f - 1.0f) / (f + 1.0f), s2 = s * s;
    float p = 1.0f / 13.0f;
    p = p * s2 + 1.0f / 11.0f;
    p = p * s2 + 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    return (float)e * 0.6931471805599453f + 2.0f * s * p;
}

/* Rows [first, end) of ensemble_log_probs; `normalisers` scratch, models floats. */
static void ensemble_rows(int64_t first, int64_t end, const int64_t *logits, const int64_t *strides,
                          int64_t models, int64_t vocab, float *out, float *normalisers) {
    const float log_models = logf((float)models);
    for (int64_t r = first; r < end; ++r) {
        for (int64_t m = 0; m < models; ++m) {
            const float *x = (const float *)(intptr_t)logits[m] + r * strides[m];
            const float max = max_of(x, vocab);
            normalisers[m] = max + logf(sum_exp(x, vocab, max));
        }
        float *o = out + r * vocab;
        /* the models' log-probabilities' maximum per token, then the log of
         * the sum of their exponentials relative to it (in [1, models]) */
        const float *x0 = (const float *)(intptr_t)logits[0] + r * strides[0];
#pragma omp simd
        for (int64_t j = 0; j < vocab; ++j) o[j] = x0[j] - normalisers[0];
        for (int64_t m = 1; m < models; ++m) {
            const float *x = (const float *)(intptr_t)logits[m] + r * strides[m];
#pragma omp simd
            for (int64_t j = 0; j < vocab; ++j) {
                const float lp = x[j] - normalisers[m];
                o[j] = lp > o[j] ? lp : o[j];
            }
        }
        for (int64_t j0 = 0; j0 < vocab; j0 += 256) {
            const int64_t width = j0 + 256 < vocab ? 256 : vocab - j0;
            float total[256];
            for (int64_t j = 0; j < width; ++j) total[j] = 0.0f;
            for (int64_t m = 0; m < models; ++m) {
                const float *x = (const float *)(intptr_t)logits[m] + r * strides[m] + j0;
#pragma omp simd
                for (int64_t j = 0; j < width; ++j) total[j] += exp_nonpositive(x[j] - normalisers[m] - o[j0 + j]);
            }
#pragma omp simd
            for (int64_t j = 0; j < width; ++j) {
                const float best = o[j0 + j];
                /* -inf everywhere stays -inf; NaN (fairseq's check) becomes -inf */
                const float v = best + log_at_least_one(total[j] < 1.0f ? 1.0f : total[j]) - log_models;
                o[j0 + j] = best == -INFINITY || v != v ? -INFINITY : v;
            }
        }
    }
}

/* fairseq's EnsembleModel's log-probabilities: per row, the log of the mean
 * of the models' probabilities, logsumexp_m(x_m - lse(x_m)) - log(models),
 * not renormalised. logits: the models' (rows x vocab) float32 logits, as
 * addresses, each with its row stride in `strides`; out: rows x vocab. */
int ensemble_log_probs(const int64_t *logits, const int64_t *strides, int64_t models, int64_t rows,
                       int64_t vocab, float *out) {
    const int threads = row_threads(rows, 4, (double)vocab * models);
    if (threads == 1) {
        float normalisers[models];
        ensemble_rows(0, rows, logits, strides, models, vocab, out, normalisers);
        return 0;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    {
        float normalisers[models];
        int64_t first, end;
        row_share(rows, omp_get_thread_num(), omp_get_num_threads(), &first, &end);
        ensemble_rows(first, end, logits, strides, models, vocab, out, normalisers);
    }
#endif
    return 0;
}

/* Finished hypotheses read back along the search's back-pointers: the
 * search records, per step s and row, the token chosen, the cumulative score
 * and the row of step s - 1 it continues (step_tokens, step_scores,
 * step_parents: (steps, stride)). Hypothesis i continues row rows[i] of step
 * `step` - 1 and ends at `step` (its EOS and final score, set by the caller);
 * positions 0..step-1 of its tokens and positional scores (n x (step + 1),
 * each score its cumulative score less the one before) are written here. */
void read_back(const int64_t *step_tokens, const float *step_scores, const int64_t *step_parents,
               int64_t stride, const int64_t *rows, int64_t n, int64_t step, int64_t *tokens, float *scores) {
    const int64_t width = step + 1;
    for (int64_t i = 0; i < n; ++i) {
        int64_t *t = tokens + i * width;
        float *c = scores + i * width;
        int64_t at = rows[i];
        for (int64_t s = step - 1; s >= 0; --s) {
            t[s] = step_tokens[s * stride + at];
            c[s] = step_scores[s * stride + at];
            at = step_parents[s * stride + at];
        }
        for (int64_t s = step; s >= 1; --s) c[s] -= c[s - 1];
    }
}
