/* A decoder layer's sublayers for one step of the plugin's search on a CPU,
 * each one call: self-attention, cross-attention and the feed-forward
 * network, each with its residual sum (the layer norms stay PyTorch's, in
 * the caller). Python would make a dozen operator calls for each, whose
 * dispatch costs more than their arithmetic when few hypotheses are left.
 *
 * The products are the BLAS calls PyTorch's CPU Linear makes: the bias
 * copied into the output, then sgemm (sgemv for one row) adding the
 * product, through the BLAS functions of PyTorch's own library, passed in
 * by the caller; the attention is step_attention.c's function, passed in
 * too. So the sums are PyTorch's, in PyTorch's order: the caller checks
 * once per process that the products give F.linear's bits, and uses these
 * calls only then.
 *
 * Features are (rows, embed) row-major; weights (out, in) as nn.Linear
 * keeps them; a bias may be NULL. Each returns 0, 2 where its scratch
 * memory could not be allocated, or the attention's status.
 *
 * decoder_step is a whole step of the decoder's layers as one call: the
 * sublayers above and between them the layer norms, layer_norm.c's
 * (PyTorch's, operation for operation; the caller checks its bits too). */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*gemm_t)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                       const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                       const float *beta, float *c, const int *ldc);
typedef void (*gemv_t)(const char *trans, const int *m, const int *n, const float *alpha, const float *a,
                       const int *lda, const float *x, const int *incx, const float *beta, float *y,
                       const int *incy);
/* step_attention.c's step_attention */
typedef int (*attention_t)(const float *q, int64_t rows, int64_t heads, int64_t dim, const float *src_keys,
                           const float *src_keys_t, const float *src_values, int64_t sentence_stride,
                           int64_t head_stride, int64_t src_position_stride, const uint8_t *src_padding,
                           int64_t src_len, int64_t group, const int64_t *src_sentences, const float *keys,
                           const float *values, const int64_t *ancestors, int64_t anc_stride, int64_t rows0,
                           int64_t length, float scale, int mode, int64_t k, const float *centres,
                           float window, float gaussian, float *out);

/* layer_norm.c's layer_norm */
typedef int (*layer_norm_t)(const float *x, int64_t rows, int64_t n, const float *gamma, const float *beta,
                            float eps, int lanes, int fused, float *y);

/* y (rows, out) = x (rows, in) w^T + b, as torch's F.linear */
static void linear(const void *gemm, const void *gemv, const float *x, int64_t rows, int64_t in,
                   const float *w, const float *b, int64_t out, float *y) {
    for (int64_t r = 0; r < rows; ++r) {
        if (b) memcpy(y + r * out, b, out * sizeof *y);
        else memset(y + r * out, 0, out * sizeof *y);
    }
    const int m = (int)out, n = (int)rows, k = (int)in, one = 1;
    const float alpha = 1.0f, beta = 1.0f;
    if (rows == 1)
        ((gemv_t)gemv)("T", &k, &m, &alpha, w, &k, x, &one, &beta, y, &one);
    else
        ((gemm_t)gemm)("T", "N", &m, &n, &k, &alpha, w, &k, x, &k, &beta, y, &m);
}

/* Scratch of `floats` floats on 64 bytes, as PyTorch's CPU allocator aligns
 * its tensors (the products' inputs then sit as they do in PyTorch's calls);
 * NULL where it cannot be allocated. */
static float *scratch(int64_t floats) {
    void *memory = 0;
    return posix_memalign(&memory, 64, (floats > 0 ? floats : 1) * sizeof(float)) ? 0 : memory;
}

/* `floats` rounded up to a multiple of 64 bytes */
static int64_t aligned(int64_t floats) { return (floats + 15) / 16 * 16; }

/* linear's product alone: what the caller compares with F.linear's bits */
void linear_product(const float *x, int64_t rows, int64_t in_features, const float *weight, const float *bias,
                    int64_t out_features, float *y, const void *gemm, const void *gemv) {
    linear(gemm, gemv, x, rows, in_features, weight, bias, out_features, y);
}

/* out = residual + out, elementwise (PyTorch's x + sublayer(x)) */
static void add_residual(float *out, const float *residual, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = residual[i] + out[i];
}

/* An attention sublayer's end: where the attention succeeded (`status`
 * 0), the output projection of `attended` (rows, width) and the residual
 * sum into `out`; frees the sublayer's `scratch`. */
static int project_out(int status, const float *attended, int64_t rows, int64_t width, const float *weight,
                       const float *bias, int64_t embed, const float *residual, float *out, const void *gemm,
                       const void *gemv, float *scratch) {
    if (status == 0) {
        linear(gemm, gemv, attended, rows, width, weight, bias, embed, out);
        add_residual(out, residual, rows * embed);
    }
    free(scratch);
    return status;
}

/* Self-attention over the lineage caches: this step's keys and values
 * written into position length - 1 of `keys` and `values` (capacity, rows0,
 * heads, head_dim), the attention over positions 0..length-1 through
 * `ancestors`, the output projection, the residual sum into `out`. */
int self_attention_sublayer(const float *x, const float *residual, float *out, int64_t rows, int64_t embed,
                            const float *q_weight, const float *q_bias, const float *k_weight,
                            const float *k_bias, const float *v_weight, const float *v_bias,
                            const float *out_weight, const float *out_bias, int64_t heads, int64_t head_dim,
                            float scale, int mode, int64_t k, float *keys, float *values,
                            const int64_t *ancestors, int64_t anc_stride, int64_t rows0, int64_t length,
                            const void *gemm, const void *gemv, const void *attention) {
    const int64_t width = heads * head_dim;
    float *q = scratch(2 * aligned(rows * width));
    if (!q) return 2;
    float *attended = q + aligned(rows * width);
    const int64_t position = (length - 1) * rows0 * width;
    linear(gemm, gemv, x, rows, embed, q_weight, q_bias, width, q);
    linear(gemm, gemv, x, rows, embed, k_weight, k_bias, width, keys + position);
    linear(gemm, gemv, x, rows, embed, v_weight, v_bias, width, values + position);
    int status = ((attention_t)attention)(q, rows, heads, head_dim, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, keys, values,
                                          ancestors, anc_stride, rows0, length, scale, mode, k, 0, 0.0f, 1.0f,
                                          attended);
    return project_out(status, attended, rows, width, out_weight, out_bias, embed, residual, out, gemm, gemv, q);
}

/* Cross-attention over the encoder's cached keys and values (step_attention's
 * source part, as its caller documents it), the output projection, the
 * residual sum into `out`. */
int cross_attention_sublayer(const float *x, const float *residual, float *out, int64_t rows, int64_t embed,
                             const float *q_weight, const float *q_bias, const float *out_weight,
                             const float *out_bias, int64_t heads, int64_t head_dim, float scale, int mode,
                             int64_t k, const float *src_keys, const float *src_keys_t,
                             const float *src_values, int64_t sentence_stride, int64_t head_stride,
                             int64_t src_position_stride, const uint8_t *src_padding, int64_t src_len,
                             int64_t group, const int64_t *src_sentences, const void *gemm, const void *gemv,
                             const void *attention) {
    const int64_t width = heads * head_dim;
    float *q = scratch(2 * aligned(rows * width));
    if (!q) return 2;
    float *attended = q + aligned(rows * width);
    linear(gemm, gemv, x, rows, embed, q_weight, q_bias, width, q);
    int status = ((attention_t)attention)(q, rows, heads, head_dim, src_keys, src_keys_t, src_values,
                                          sentence_stride, head_stride, src_position_stride, src_padding,
                                          src_len, group, src_sentences, 0, 0, 0, 0, 0, 0, scale, mode, k, 0,
                                          0.0f, 1.0f, attended);
    return project_out(status, attended, rows, width, out_weight, out_bias, embed, residual, out, gemm, gemv, q);
}

/* fc2(relu(fc1(x))) and the residual sum into `out`. */
int feed_forward_sublayer(const float *x, const float *residual, float *out, int64_t rows, int64_t embed,
                          int64_t hidden, const float *fc1_weight, const float *fc1_bias,
                          const float *fc2_weight, const float *fc2_bias, const void *gemm, const void *gemv) {
    float *h = scratch(rows * hidden);
    if (!h) return 2;
    linear(gemm, gemv, x, rows, embed, fc1_weight, fc1_bias, hidden, h);
    for (int64_t i = 0; i < rows * hidden; ++i) h[i] = h[i] < 0.0f ? 0.0f : h[i]; /* NaN stays NaN */
    linear(gemm, gemv, h, rows, hidden, fc2_weight, fc2_bias, embed, out);
    add_residual(out, residual, rows * embed);
    free(h);
    return 0;
}

/* A layer's record in decoder_step's `layers` table: int64 slots, addresses
 * and sizes, filled by the caller by these names. */
enum layer_slot {
    SELF_Q_WEIGHT, SELF_Q_BIAS, SELF_K_WEIGHT, SELF_K_BIAS, SELF_V_WEIGHT, SELF_V_BIAS, SELF_OUT_WEIGHT,
    SELF_OUT_BIAS, SELF_HEADS, SELF_HEAD_DIM, SELF_MODE, SELF_TOP_K, KEYS, VALUES,
    CROSS_Q_WEIGHT, CROSS_Q_BIAS, CROSS_OUT_WEIGHT, CROSS_OUT_BIAS, CROSS_HEADS, CROSS_HEAD_DIM, CROSS_MODE,
    CROSS_TOP_K, SRC_KEYS, SRC_KEYS_T, SRC_VALUES, SENTENCE_STRIDE, HEAD_STRIDE, SRC_POSITION_STRIDE,
    SRC_PADDING, SRC_LEN, GROUP, SRC_SENTENCES,
    FC1_WEIGHT, FC1_BIAS, FC2_WEIGHT, FC2_BIAS, HIDDEN,
    SELF_NORM_WEIGHT, SELF_NORM_BIAS, CROSS_NORM_WEIGHT, CROSS_NORM_BIAS, FINAL_NORM_WEIGHT, FINAL_NORM_BIAS,
    LAYER_SLOTS
};
/* A layer's float32 scalars in decoder_step's `scalars` table */
enum layer_scalar { SELF_SCALE, CROSS_SCALE, SELF_NORM_EPS, CROSS_NORM_EPS, FINAL_NORM_EPS, LAYER_SCALARS };

#define F32(slot) ((const float *)(intptr_t)layer[slot])

/* fairseq's residual block around one sublayer, `x` updated in place:
 * post-norm x = norm(x + body(x)); pre-norm x = x + body(norm(x)).
 * `body` writes residual + sublayer(input) into `out`. */
#define RESIDUAL_BLOCK(NORM_WEIGHT, NORM_BIAS, NORM_EPS, CALL)                                            \
    do {                                                                                              \
        const float *input = x;                                                                       \
        if (pre_norm) {                                                                               \
            status = ((layer_norm_t)layer_norm)(x, rows, embed, F32(NORM_WEIGHT), F32(NORM_BIAS),       \
                                                scalars[NORM_EPS], norm_lanes, norm_fused, normed);    \
            input = normed;                                                                           \
            if (status) break;                                                                        \
        }                                                                                             \
        status = (CALL);                                                                              \
        if (status) break;                                                                            \
        if (pre_norm) {                                                                               \
            float *swap = x; x = summed; summed = swap;                                               \
        } else {                                                                                      \
            status = ((layer_norm_t)layer_norm)(summed, rows, embed, F32(NORM_WEIGHT), F32(NORM_BIAS),  \
                                                scalars[NORM_EPS], norm_lanes, norm_fused, x);         \
        }                                                                                             \
    } while (0)

/* The decoder's layers for one step: `features` (rows, embed) in, the last
 * layer's output (then `last_norm` where given) into `out`. Each layer as
 * fairseq's TransformerDecoderLayer with no optional part: self-attention
 * over the lineage caches, cross-attention over the encoder's cached keys
 * and values, the feed-forward network (ReLU), each a residual block;
 * `layers` and `scalars`: `n_layers` records (layer_slot, layer_scalar).
 * Returns 0, 1 where a layer norm's vector width is not one it knows, 2
 * where scratch memory could not be allocated, or an attention's status. */
int decoder_step(const float *features, float *out, int64_t rows, int64_t embed, int64_t n_layers,
                 const int64_t *layers, const float *layer_scalars, int pre_norm, const int64_t *ancestors,
                 int64_t anc_stride, int64_t rows0, int64_t length, const float *last_norm_weight,
                 const float *last_norm_bias, float last_norm_eps, int norm_lanes, int norm_fused,
                 const void *gemm, const void *gemv, const void *attention, const void *layer_norm) {
    const int64_t n = rows * embed;
    float *memory = scratch(3 * aligned(n));
    if (!memory) return 2;
    float *x = memory, *summed = memory + aligned(n), *normed = memory + 2 * aligned(n);
    memcpy(x, features, n * sizeof *x);
    int status = 0;
    for (int64_t i = 0; i < n_layers && !status; ++i) {
        const int64_t *layer = layers + i * LAYER_SLOTS;
        const float *scalars = layer_scalars + i * LAYER_SCALARS;
        RESIDUAL_BLOCK(SELF_NORM_WEIGHT, SELF_NORM_BIAS, SELF_NORM_EPS, self_attention_sublayer(
            input, x, summed, rows, embed, F32(SELF_Q_WEIGHT), F32(SELF_Q_BIAS), F32(SELF_K_WEIGHT),
            F32(SELF_K_BIAS), F32(SELF_V_WEIGHT), F32(SELF_V_BIAS), F32(SELF_OUT_WEIGHT), F32(SELF_OUT_BIAS),
            layer[SELF_HEADS], layer[SELF_HEAD_DIM], scalars[SELF_SCALE], (int)layer[SELF_MODE],
            layer[SELF_TOP_K], (float *)(intptr_t)layer[KEYS], (float *)(intptr_t)layer[VALUES], ancestors,
            anc_stride, rows0, length, gemm, gemv, attention));
        if (status) break;
        RESIDUAL_BLOCK(CROSS_NORM_WEIGHT, CROSS_NORM_BIAS, CROSS_NORM_EPS, cross_attention_sublayer(
            input, x, summed, rows, embed, F32(CROSS_Q_WEIGHT), F32(CROSS_Q_BIAS), F32(CROSS_OUT_WEIGHT),
            F32(CROSS_OUT_BIAS), layer[CROSS_HEADS], layer[CROSS_HEAD_DIM], scalars[CROSS_SCALE],
            (int)layer[CROSS_MODE], layer[CROSS_TOP_K], F32(SRC_KEYS), F32(SRC_KEYS_T), F32(SRC_VALUES),
            layer[SENTENCE_STRIDE], layer[HEAD_STRIDE], layer[SRC_POSITION_STRIDE],
            (const uint8_t *)(intptr_t)layer[SRC_PADDING], layer[SRC_LEN], layer[GROUP],
            (const int64_t *)(intptr_t)layer[SRC_SENTENCES], gemm, gemv, attention));
        if (status) break;
        RESIDUAL_BLOCK(FINAL_NORM_WEIGHT, FINAL_NORM_BIAS, FINAL_NORM_EPS, feed_forward_sublayer(
            input, x, summed, rows, embed, layer[HIDDEN], F32(FC1_WEIGHT), F32(FC1_BIAS), F32(FC2_WEIGHT),
            F32(FC2_BIAS), gemm, gemv));
    }
    if (!status) {
        if (last_norm_weight)
            status = ((layer_norm_t)layer_norm)(x, rows, embed, last_norm_weight, last_norm_bias, last_norm_eps,
                                                norm_lanes, norm_fused, out);
        else
            memcpy(out, x, n * sizeof *x);
    }
    free(memory);
    return status;
}
#undef RESIDUAL_BLOCK
#undef F32
