/* Float32 Linear products of few rows in the BLAS's own order, without the
 * BLAS's cost per call.
 *
 * For a product of a handful of rows, PyTorch's BLAS (MKL) spends more
 * time copying the weight into its packed layout, at every call, than
 * multiplying. Its result is a fixed formula, though: each output is the
 * bias plus, block by block of the inner dimension, that block's products
 * summed from zero in order, one fused multiply-add at a time:
 *
 *   y[r][o] = ((b[o] + sum_{k in block 0} x[r][k] w[o][k]) + sum_{k in block 1} ...) ...
 *
 * This file computes that formula on a weight packed once (panels of
 * FH_PANEL_WIDTH output rows, the inner index outermost), so the same bits
 * for a fraction of the time. Which block the BLAS uses, and whether it
 * keeps the formula for a given number of rows and threads (a row count
 * it splits over threads, or one to three rows, take other kernels), is not
 * assumed: the caller finds the block on the layer's own weight
 * (bindings.cpp), and each row count is checked once per thread count
 * against the BLAS's own result (panelled_product) before these
 * products replace it. Every vector width below computes the same
 * fused sums in the same order, so the same bits; the panels split over
 * torch's OpenMP threads (parallel_rows.h), each output's sum whole. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "native.h"
#include "parallel_rows.h"

enum { WIDTH = FH_PANEL_WIDTH, TILE = 4 };
#define PANEL_PARALLEL_WORK (1 << 20)

int64_t panel_floats(int64_t out, int64_t in) { return (out + WIDTH - 1) / WIDTH * in * WIDTH; }

void panel_pack(const float *w, int64_t out, int64_t in, int64_t out_stride, int64_t in_stride, float *panels) {
    for (int64_t first = 0; first < out; first += WIDTH) {
        const int64_t lanes = out - first < WIDTH ? out - first : WIDTH;
        float *panel = panels + first * in;
        for (int64_t k = 0; k < in; ++k) {
            const float *column = w + first * out_stride + k * in_stride;
            for (int64_t lane = 0; lane < WIDTH; ++lane)
                panel[k * WIDTH + lane] = lane < lanes ? column[lane * out_stride] : 0.0f;
        }
    }
}

/* Up to TILE rows of x (row stride `in`) times one panel: `cols` outputs
 * at y (row stride ldy). */
#if defined(__AVX512F__)
static void panel_tile(const float *x, int64_t in, int rows, const float *panel, const float *bias, int cols,
                       int64_t block, float *y, int64_t ldy) {
    const __mmask16 mask = (__mmask16)((1u << cols) - 1);
    __m512 c[TILE], a[TILE];
    for (int r = 0; r < TILE; ++r) c[r] = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
    for (int64_t start = 0; start < in; start += block) {
        const int64_t end = start + block < in ? start + block : in;
        for (int r = 0; r < TILE; ++r) a[r] = _mm512_setzero_ps();
        for (int64_t k = start; k < end; ++k) {
            const __m512 w = _mm512_loadu_ps(panel + k * WIDTH);
            for (int r = 0; r < TILE; ++r)
                if (r < rows) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in + k]), w, a[r]);
        }
        for (int r = 0; r < TILE; ++r) c[r] = _mm512_add_ps(c[r], a[r]);
    }
    for (int r = 0; r < rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, c[r]);
}
#elif defined(__AVX2__) && defined(__FMA__)
static void panel_tile(const float *x, int64_t in, int rows, const float *panel, const float *bias, int cols,
                       int64_t block, float *y, int64_t ldy) {
    float first[WIDTH] = {0}, out[TILE][WIDTH];
    if (bias) memcpy(first, bias, cols * sizeof *first);
    __m256 c[TILE][2], a[TILE][2];
    for (int r = 0; r < TILE; ++r)
        for (int h = 0; h < 2; ++h) c[r][h] = _mm256_loadu_ps(first + 8 * h);
    for (int64_t start = 0; start < in; start += block) {
        const int64_t end = start + block < in ? start + block : in;
        for (int r = 0; r < TILE; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int64_t k = start; k < end; ++k) {
            const __m256 w0 = _mm256_loadu_ps(panel + k * WIDTH), w1 = _mm256_loadu_ps(panel + k * WIDTH + 8);
            for (int r = 0; r < TILE; ++r)
                if (r < rows) {
                    const __m256 xr = _mm256_set1_ps(x[r * in + k]);
                    a[r][0] = _mm256_fmadd_ps(xr, w0, a[r][0]);
                    a[r][1] = _mm256_fmadd_ps(xr, w1, a[r][1]);
                }
        }
        for (int r = 0; r < TILE; ++r)
            for (int h = 0; h < 2; ++h) c[r][h] = _mm256_add_ps(c[r][h], a[r][h]);
    }
    for (int r = 0; r < rows; ++r) {
        _mm256_storeu_ps(out[r], c[r][0]);
        _mm256_storeu_ps(out[r] + 8, c[r][1]);
        memcpy(y + r * ldy, out[r], cols * sizeof *y);
    }
}
#else
static void panel_tile(const float *x, int64_t in, int rows, const float *panel, const float *bias, int cols,
                       int64_t block, float *y, int64_t ldy) {
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < cols; ++o) {
            float c = bias ? bias[o] : 0.0f;
            for (int64_t start = 0; start < in; start += block) {
                const int64_t end = start + block < in ? start + block : in;
                float a = 0.0f;
                for (int64_t k = start; k < end; ++k) a = fmaf(x[r * in + k], panel[k * WIDTH + o], a);
                c = c + a;
            }
            y[r * ldy + o] = c;
        }
}
#endif

/* panels [first, end) of the product */
static void panel_range(const float *panels, int64_t block, const float *bias, int64_t out, int64_t in,
                        const float *x, int64_t rows, float *y, int64_t first, int64_t end) {
    for (int64_t j = first; j < end; ++j) {
        const int cols = out - j * WIDTH < WIDTH ? (int)(out - j * WIDTH) : WIDTH;
        for (int64_t r = 0; r < rows; r += TILE)
            panel_tile(x + r * in, in, rows - r < TILE ? (int)(rows - r) : TILE, panels + j * in * WIDTH,
                       bias ? bias + j * WIDTH : 0, cols, block, y + r * out + j * WIDTH, out);
    }
}

void panel_product(const float *panels, int64_t block, const float *bias, int64_t out, int64_t in, const float *x,
                   int64_t rows, float *y) {
    const int64_t n_panels = (out + WIDTH - 1) / WIDTH;
    // (at this kernel's rate a product under PANEL_PARALLEL_WORK multiply-adds
    // takes less time than waking the thread pool)
    const double work = (double)rows * out * in;
    const int threads = work < PANEL_PARALLEL_WORK ? 1 : row_threads(n_panels, 2, (double)rows * WIDTH * in);
    if (threads == 1) {
        panel_range(panels, block, bias, out, in, x, rows, y, 0, n_panels);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    {
        int64_t first, end;
        row_share(n_panels, omp_get_thread_num(), omp_get_num_threads(), &first, &end);
        panel_range(panels, block, bias, out, in, x, rows, y, first, end);
    }
#endif
}

int panel_use(const struct fh_panels *panels, int64_t rows, int threads) {
    if (!panels->weight || rows < 1 || rows > FH_PANEL_MAX_ROWS || threads < 1) return FH_PANELS_NOT;
    const int checked = __atomic_load_n(&panels->checked[rows], __ATOMIC_RELAXED);
    if (checked == threads) return FH_PANELS_USE;
    return checked == -threads ? FH_PANELS_NOT : FH_PANELS_CHECK;
}

int panelled_product(const struct fh_panels *panels, const float *bias, int64_t out, int64_t in, const float *x,
                     int64_t rows, int threads, fh_product_fn reference, void *context, float *y) {
    const int use = panel_use(panels, rows, threads);
    if (use == FH_PANELS_USE) {
        panel_product(panels->weight, panels->block, bias, out, in, x, rows, y);
        return 0;
    }
    const int status = reference(context, x, rows, y);
    if (status || use == FH_PANELS_NOT) return status;
    void *mine = NULL;
    if (posix_memalign(&mine, 64, rows * out * sizeof *y)) return 2;
    panel_product(panels->weight, panels->block, bias, out, in, x, rows, mine);
    const int same = !memcmp(mine, y, rows * out * sizeof *y);
    free(mine);
    __atomic_store_n(&panels->checked[rows], (int16_t)(same ? threads : -threads), __ATOMIC_RELAXED);
    return 0;
}
