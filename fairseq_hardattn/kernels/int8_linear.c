/* int8 Linear layers for decoding on a CPU (--int8-decoding): weights
 * quantized once per output row, activations per input row at each
 * product, both symmetric to [-127, 127] (native.h's fh_int8_linear):
 *
 *   y[r][o] = (float)(sum_k xq[r][k] wq[o][k]) * (sx[r] * sw[o]) + b[o]
 *
 * The sums are of integers, exact in any order, so a product is the same
 * on every CPU: with AVX-512 VNNI (vpdpbusd on unsigned activations, xq +
 * 128, less 128 times each row's weight sum), with AVX2 (vpmaddubsw on the
 * activations' magnitudes and the weights with their signs, no saturation
 * within [-127, 127]) or neither. The float steps are written apart
 * (this file is built without contraction): PyTorch's ops repeat them
 * exactly where the library is not built (decoding/int8.py).
 *
 * A product quantizes its rows once, then runs a block of FH_INT8_BLOCK
 * output rows at a time over every tile of rows (the block's weights stay
 * in the first-level cache while the rows pass), blocks split over torch's
 * OpenMP threads (parallel_rows.h). Small rows cost what their arithmetic
 * does: no per-call packing, no per-call set-up of another library. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

#include "native.h"
#include "parallel_rows.h"

enum { BLOCK = FH_INT8_BLOCK, GROUP = 4 };
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define WITH_VNNI 1
#define TILE_IS_8 1
enum { TILE = 8 };
#elif defined(__AVX2__)
#define WITH_AVX2 1
enum { TILE = 4 };
#else
enum { TILE = 4 };
#endif

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t int8_packed_bytes(int64_t out, int64_t in) { return round_up(out, BLOCK) * round_up(in, GROUP); }

/* One row's scale (its largest magnitude / 127; 0 for a row of zeros; NAN
 * for a row with an infinity or a NaN) and its values xq = x / s rounded
 * half to even. */
static float quantize_row(const float *x, int64_t n, int8_t *q) {
    float amax = 0.0f;
    int finite = 1;
    for (int64_t k = 0; k < n; ++k) {
        const float a = fabsf(x[k]);
        finite &= a <= FLT_MAX;
        amax = a > amax ? a : amax;
    }
    if (!finite || amax == 0.0f) {
        memset(q, 0, n);
        return finite ? 0.0f : NAN;
    }
    const float s = amax / 127.0f;
    for (int64_t k = 0; k < n; ++k) q[k] = (int8_t)nearbyintf(x[k] / s);
    return s;
}

void int8_quantize_rows(const float *x, int64_t rows, int64_t n, int8_t *xq, float *scales) {
    for (int64_t r = 0; r < rows; ++r) scales[r] = quantize_row(x + r * n, n, xq + r * n);
}

void int8_pack(const float *w, int64_t out, int64_t in, int8_t *weight, float *scales, int32_t *sums) {
    const int64_t in_p = round_up(in, GROUP), groups = in_p / GROUP, out_p = round_up(out, BLOCK);
    memset(weight, 0, out_p * in_p);
    int8_t row[in > 0 ? in : 1];
    for (int64_t o = 0; o < out_p; ++o) {
        scales[o] = 0.0f;
        sums[o] = 0;
        if (o >= out) continue;
        scales[o] = quantize_row(w + o * in, in, row);
        int32_t sum = 0;
        int8_t *block = weight + (o / BLOCK) * groups * BLOCK * GROUP + (o % BLOCK) * GROUP;
        for (int64_t k = 0; k < in; ++k) {
            sum += row[k];
            block[(k / GROUP) * BLOCK * GROUP + k % GROUP] = row[k];
        }
        sums[o] = 128 * sum;
    }
}

void int8_rows(const struct fh_int8_linear *l, const int64_t *rows, int64_t n, int8_t *weight, float *scales,
               int32_t *sums) {
    const int64_t groups = round_up(l->in, GROUP) / GROUP, n_p = round_up(n, BLOCK);
    memset(weight, 0, n_p * groups * GROUP);
    for (int64_t i = 0; i < n_p; ++i) {
        scales[i] = i < n ? l->scales[rows[i]] : 0.0f;
        sums[i] = i < n ? l->sums[rows[i]] : 0;
        if (i >= n) continue;
        const int64_t o = rows[i];
        const int8_t *from = l->weight + (o / BLOCK) * groups * BLOCK * GROUP + (o % BLOCK) * GROUP;
        int8_t *to = weight + (i / BLOCK) * groups * BLOCK * GROUP + (i % BLOCK) * GROUP;
        for (int64_t g = 0; g < groups; ++g) memcpy(to + g * BLOCK * GROUP, from + g * BLOCK * GROUP, GROUP);
    }
}

/* Output rows [o0, o0 + width) of rows [r0, r0 + count) from their integer
 * sums acc[r][j]: the scales, then the bias (the path without vectors). */
static void finish(const struct fh_int8_linear *l, const float *sx, int64_t r0, int64_t count, int64_t o0,
                   int64_t width, const int32_t acc[][BLOCK], float *y) {
    for (int64_t r = 0; r < count; ++r) {
        float *row = y + (r0 + r) * l->out + o0;
        for (int64_t j = 0; j < width; ++j) {
            const float m = sx[r0 + r] * l->scales[o0 + j];
            const float v = (float)acc[r][j] * m;
            row[j] = l->bias ? v + l->bias[o0 + j] : v;
        }
    }
}

/* One block of output rows over R rows from r0 (R a constant where
 * inlined, so that the sums stay in registers): xq (rows, in_p) as the
 * sums read them (offset by 128 for VNNI). */
static inline __attribute__((always_inline)) void block_rows(const struct fh_int8_linear *l, const uint8_t *xq,
                                                             int64_t in_p, const float *sx, int64_t b, int64_t r0,
                                                             const int R, float *y) {
    const int64_t groups = in_p / GROUP, o0 = b * BLOCK, width = l->out - o0 < BLOCK ? l->out - o0 : BLOCK;
    const int8_t *w = l->weight + b * groups * BLOCK * GROUP;
    const uint8_t *x = xq + r0 * in_p;
#if defined(WITH_VNNI)
    __m512i sums[TILE];
    for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g) {
        const __m512i wv = _mm512_loadu_si512((const void *)(w + g * BLOCK * GROUP));
        for (int r = 0; r < R; ++r) {
            int32_t four;
            memcpy(&four, x + r * in_p + g * GROUP, sizeof four);
            sums[r] = _mm512_dpbusd_epi32(sums[r], _mm512_set1_epi32(four), wv);
        }
    }
    const __mmask16 mask = (__mmask16)((1u << width) - 1u);
    const __m512i offset = _mm512_loadu_si512((const void *)(l->sums + o0));
    const __m512 scales = _mm512_loadu_ps(l->scales + o0);
    const __m512 bias = l->bias ? _mm512_maskz_loadu_ps(mask, l->bias + o0) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
        const __m512 m = _mm512_mul_ps(_mm512_set1_ps(sx[r0 + r]), scales);
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums[r], offset)), m);
        if (l->bias) v = _mm512_add_ps(v, bias);
        _mm512_mask_storeu_ps(y + (r0 + r) * l->out + o0, mask, v);
    }
#elif defined(WITH_AVX2)
    __m256i sums[TILE][2];
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t g = 0; g < groups; ++g) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + g * BLOCK * GROUP));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + g * BLOCK * GROUP + 32));
        for (int r = 0; r < R; ++r) {
            int32_t four;
            memcpy(&four, x + r * in_p + g * GROUP, sizeof four);
            const __m256i a = _mm256_set1_epi32(four), magnitude = _mm256_abs_epi8(a);
            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w0, a)), ones);
            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w1, a)), ones);
            sums[r][0] = _mm256_add_epi32(sums[r][0], p0);
            sums[r][1] = _mm256_add_epi32(sums[r][1], p1);
        }
    }
    int32_t acc[TILE][BLOCK];
    for (int r = 0; r < R; ++r) {
        _mm256_storeu_si256((__m256i *)acc[r], sums[r][0]);
        _mm256_storeu_si256((__m256i *)(acc[r] + 8), sums[r][1]);
    }
    finish(l, sx, r0, R, o0, width, (const int32_t(*)[BLOCK])acc, y);
#else
    int32_t acc[TILE][BLOCK];
    for (int r = 0; r < R; ++r) {
        for (int64_t j = 0; j < BLOCK; ++j) acc[r][j] = 0;
        const int8_t *a = (const int8_t *)x + r * in_p;
        for (int64_t g = 0; g < groups; ++g)
            for (int64_t j = 0; j < BLOCK; ++j)
                for (int64_t i = 0; i < GROUP; ++i)
                    acc[r][j] += (int32_t)a[g * GROUP + i] * w[(g * BLOCK + j) * GROUP + i];
    }
    finish(l, sx, r0, R, o0, width, (const int32_t(*)[BLOCK])acc, y);
#endif
}

/* A block over rows [r0, r0 + count), count <= TILE, its row count a constant in each branch */
static void block_tile(const struct fh_int8_linear *l, const uint8_t *xq, int64_t in_p, const float *sx, int64_t b,
                       int64_t r0, int64_t count, float *y) {
    switch (count) {
#define ROWS(R) case R: block_rows(l, xq, in_p, sx, b, r0, R, y); break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4)
#if TILE_IS_8
    ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#endif
#undef ROWS
    default: break;
    }
}

/* Blocks [first, end) over every row, CHUNK rows at a time: a chunk's
 * activations stay in the first-level cache while the blocks pass, and its
 * outputs in the second (all the rows at once thrash both). */
enum { CHUNK = 64 };
static void blocks(const struct fh_int8_linear *l, const uint8_t *xq, int64_t in_p, const float *sx, int64_t rows,
                   int64_t first, int64_t end, float *y) {
    for (int64_t c0 = 0; c0 < rows; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < rows ? c0 + CHUNK : rows;
        for (int64_t b = first; b < end; ++b)
            for (int64_t r0 = c0; r0 < c1; r0 += TILE)
                block_tile(l, xq, in_p, sx, b, r0, c1 - r0 < TILE ? c1 - r0 : TILE, y);
    }
}

int int8_product(void *context, const float *x, int64_t rows, float *y) {
    const struct fh_int8_linear *l = context;
    const int64_t in_p = round_up(l->in, GROUP), n_blocks = round_up(l->out, BLOCK) / BLOCK;
    void *memory = 0;
    if (posix_memalign(&memory, 64, rows * in_p + rows * sizeof(float) + 64)) return 2;
    uint8_t *xq = memory;
    float *sx = (float *)(xq + round_up(rows * in_p, 64));
    for (int64_t r = 0; r < rows; ++r) {
        int8_t *q = (int8_t *)xq + r * in_p;
        sx[r] = quantize_row(x + r * l->in, l->in, q);
        memset(q + l->in, 0, in_p - l->in);
    }
#if defined(WITH_VNNI)
    for (int64_t i = 0; i < rows * in_p; ++i) xq[i] ^= 0x80; /* xq + 128, as unsigned */
#endif
    const int threads = row_threads(n_blocks, 4, (double)rows * BLOCK * in_p / 4);
    if (threads == 1) {
        blocks(l, xq, in_p, sx, rows, 0, n_blocks, y);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
        {
            int64_t first, end;
            row_share(n_blocks, omp_get_thread_num(), omp_get_num_threads(), &first, &end);
            blocks(l, xq, in_p, sx, rows, first, end, y);
        }
#endif
    }
    free(memory);
    return 0;
}
