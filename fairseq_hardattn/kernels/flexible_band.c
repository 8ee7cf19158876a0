/* One decoding step of flexible attention, scoring only the bands.
 *
 * For each query row r (ordered sentence, hypothesis, head), with centre
 * c = p_{t-1} and gate g: the band is the integer positions s with
 * |s - c| < sigma * sqrt(2 tau / g), plus the one nearest c, clipped to the
 * source, minus padded keys (windows.band_limits / in_band: the
 * same float32 arithmetic). Only those positions are scored, in place in the
 * batch-major K cache (nothing gathered or copied):
 *   logit(s) = (scaling q) . k_s  -  g (s - c)^2 / (2 sigma^2)
 *   a = softmax(logits),  out = sum_s a(s) v_s,  new centre = sum_s a(s) s.
 * The hypotheses of a beam read their sentence's K/V rows (fairseq keeps one
 * copy per sentence): kv row = sentence * heads + head.
 *
 * A loop per row and position is what PyTorch cannot express without a
 * dozen small ops per step (band limits, windows, masks, gathers); those
 * ops, not the scores, dominated banded decoding on CPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "native.h"

static float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* The step; inlined below with head_dim a constant for the usual head
 * sizes, so that dot products and value sums unroll into registers. */
static inline __attribute__((always_inline)) int band_step(
    const float *q,            /* (rows, head_dim), unscaled */
    int64_t rows, int64_t head_dim, float scaling,
    const float *k,            /* (kv_rows, src_len, head_dim) */
    const float *v,            /* (kv_rows, src_len, head_dim) */
    int64_t src_len,
    const uint8_t *padding,    /* (kv_bsz, src_len), nonzero = padded; or NULL */
    int64_t beam, int64_t heads,
    const float *centre,       /* (rows,) p_{t-1} */
    const float *gate,         /* (rows,) g_t */
    float sigma, float two_tau, float penalty_coef, /* 2 tau; -1 / (2 sigma^2) */
    float *out,                /* (rows, head_dim) */
    float *new_centre,         /* (rows,) */
    int64_t *scored)           /* (rows,) band sizes, for CPS */
{
    const size_t slots = (size_t)(src_len > 0 ? src_len : 1);
    float *logits = malloc(sizeof(float) * slots);
    int64_t *positions = malloc(sizeof(int64_t) * slots);
    float *query = malloc(sizeof(float) * (size_t)(head_dim > 0 ? head_dim : 1));
    if (logits == NULL || positions == NULL || query == NULL) {
        free(logits);
        free(positions);
        free(query);
        return -1;
    }
    const float last = (float)(src_len - 1);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t sentence = r / (beam * heads);
        const int64_t kv_row = sentence * heads + r % heads;
        const float *keys = k + kv_row * src_len * head_dim;
        const float *values = v + kv_row * src_len * head_dim;
        const uint8_t *padded = padding ? padding + sentence * src_len : NULL;
        const float c = centre[r], g = gate[r];
        for (int64_t d = 0; d < head_dim; d++) query[d] = q[r * head_dim + d] * scaling;

        /* band_limits: the same float32 operations, in the same order */
        const float clamped = g < 1e-6f ? 1e-6f : g;
        const float half = sigma * sqrtf(two_tau / clamped);
        const float nearest = nearbyintf(c); /* torch.round: half to even */
        float low = floorf(c - half) + 1.0f;
        if (nearest < low) low = nearest;
        if (!(low >= 0.0f)) low = 0.0f;
        float high = ceilf(c + half) - 1.0f;
        if (nearest > high) high = nearest;
        if (!(high <= last)) high = last;
        const int64_t first = (int64_t)low, stop = (int64_t)high + 1;

        /* scores of the band's unpadded positions, packed */
        int64_t count = 0;
        for (int64_t s = first; s < stop; s++) {
            if (padded && padded[s]) continue;
            const float distance = (float)s - c;
            positions[count] = s;
            logits[count++] = dot(query, keys + s * head_dim, head_dim)
                              + penalty_coef * (distance * distance) * g;
        }
        float *row_out = out + r * head_dim;
        if (count == 0) { /* every band position padded: as softmax over nothing */
            for (int64_t d = 0; d < head_dim; d++) row_out[d] = NAN;
            new_centre[r] = NAN;
            scored[r] = 0;
            continue;
        }
        float top = logits[0];
        for (int64_t i = 1; i < count; i++) top = logits[i] > top ? logits[i] : top;
        float total = 0.0f;
        for (int64_t i = 0; i < count; i++) {
            logits[i] = expf(logits[i] - top);
            total += logits[i];
        }
        for (int64_t d = 0; d < head_dim; d++) row_out[d] = 0.0f;
        float moved = 0.0f;
        for (int64_t i = 0; i < count; i++) {
            const float a = logits[i] / total;
            const float *value = values + positions[i] * head_dim;
            moved += a * (float)positions[i];
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) row_out[d] += a * value[d];
        }
        new_centre[r] = moved;
        scored[r] = count;
    }
    free(logits);
    free(positions);
    free(query);
    return 0;
}

/* Returns 0, or -1 when scratch memory cannot be allocated. */
int flexible_band_step(
    const float *q, int64_t rows, int64_t head_dim, float scaling,
    const float *k, const float *v, int64_t src_len, const uint8_t *padding,
    int64_t beam, int64_t heads, const float *centre, const float *gate,
    float sigma, float two_tau, float penalty_coef,
    float *out, float *new_centre, int64_t *scored)
{
#define BAND_STEP(HEAD_DIM)                                                    \
    band_step(q, rows, HEAD_DIM, scaling, k, v, src_len, padding, beam, heads, \
              centre, gate, sigma, two_tau, penalty_coef, out, new_centre, scored)
    switch (head_dim) {
    case 32: return BAND_STEP(32);  /* d = 128 with 4 heads (the small preset) */
    case 64: return BAND_STEP(64);  /* d = 512 with 8 heads (Base) */
    default: return BAND_STEP(head_dim);
    }
#undef BAND_STEP
}
