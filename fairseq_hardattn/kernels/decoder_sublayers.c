/* A decoder layer's sublayers for one step of the plugin's search on a CPU,
 * each one call: self-attention, cross-attention and the feed-forward
 * network, each with its residual sum (the layer norms stay PyTorch's, in
 * the caller, or decoder_step below). Python would make a dozen operator calls for each, whose
 * dispatch costs more than their arithmetic when few hypotheses are left.
 *
 * The products are the BLAS calls PyTorch's CPU Linear makes: the bias
 * copied into the output, then sgemm (sgemv for one row) adding the
 * product, through the BLAS functions of PyTorch's own library, passed in
 * by the caller; the attention is step_attention.c's. So the sums are
 * PyTorch's, in PyTorch's order: the caller checks once per process that
 * the products give F.linear's bits, and uses these calls only then. For
 * few rows, panel_linear.c's products replace the BLAS's where they give
 * its bits (checked once per row count and thread count).
 *
 * A Linear layer with a product of its own (oneDNN's packed kernel, an
 * int8 one: native.h's fh_linear) is multiplied by it instead.
 *
 * Features are (rows, embed) row-major; weights (out, in) as nn.Linear
 * keeps them; a bias may be NULL. Each returns 0, 2 where its scratch
 * memory could not be allocated, 3 where a product failed, or the
 * attention's status.
 *
 * decoder_step is a whole step of the decoder's layers as one call: the
 * sublayers above and between them the layer norms, layer_norm.c's
 * (PyTorch's, operation for operation; the caller checks its bits too). */

#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* Scratch of `floats` floats on 64 bytes, as PyTorch's CPU allocator aligns
 * its tensors (the products' inputs then sit as they do in PyTorch's calls);
 * NULL where it cannot be allocated. */
static float *scratch(int64_t floats) {
    void *memory = 0;
    return posix_memalign(&memory, 64, (floats > 0 ? floats : 1) * sizeof(float)) ? 0 : memory;
}

/* y (rows, out) = x (rows, in) w^T + b, as torch's F.linear computes it */
static void blas_linear(const struct fh_blas *blas, const float *x, int64_t rows, const struct fh_linear *l, float *y) {
    for (int64_t r = 0; r < rows; ++r) {
        if (l->bias) memcpy(y + r * l->out, l->bias, l->out * sizeof *y);
        else memset(y + r * l->out, 0, l->out * sizeof *y);
    }
    const int m = (int)l->out, n = (int)rows, k = (int)l->in, one = 1;
    const float alpha = 1.0f, beta = 1.0f;
    if (rows == 1)
        blas->gemv("T", &k, &m, &alpha, l->weight, &k, x, &one, &beta, y, &one);
    else
        blas->gemm("T", "N", &m, &n, &k, &alpha, l->weight, &k, x, &k, &beta, y, &m);
}

struct blas_call {
    const struct fh_blas *blas;
    const struct fh_linear *layer;
};

static int blas_reference(void *context, const float *x, int64_t rows, float *y) {
    const struct blas_call *call = context;
    blas_linear(call->blas, x, rows, call->layer, y);
    return 0;
}

/* the same (or the layer's own product), panel_linear.c's where it gives
 * the BLAS's bits for these rows */
static int linear(const struct fh_blas *blas, const float *x, int64_t rows, const struct fh_linear *l, float *y) {
    if (l->product) return l->product(l->context, x, rows, y);
    struct blas_call call = {blas, l};
    return panelled_product(&l->panels, l->bias, l->out, l->in, x, rows, l->panels.weight ? blas->threads() : 0,
                            blas_reference, &call, y);
}

/* `floats` rounded up to a multiple of 64 bytes */
static int64_t aligned(int64_t floats) { return (floats + 15) / 16 * 16; }

int linear_product(const struct fh_blas *blas, const float *x, int64_t rows, const struct fh_linear *l, float *y) {
    return linear(blas, x, rows, l, y);
}

/* out = residual + out, elementwise (PyTorch's x + sublayer(x)) */
static void add_residual(float *out, const float *residual, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = residual[i] + out[i];
}

/* An attention sublayer's end: where the attention succeeded (`status`
 * 0), the output projection of `attended` and the residual sum into `out`;
 * frees the sublayer's `scratch`. */
static int project_out(const struct fh_blas *blas, int status, const float *attended, int64_t rows,
                       const struct fh_linear *out_projection, const float *residual, float *out, float *scratch) {
    if (status == 0) status = linear(blas, attended, rows, out_projection, out);
    if (status == 0) add_residual(out, residual, rows * out_projection->out);
    free(scratch);
    return status;
}

int self_attention_sublayer(const struct fh_blas *blas, const float *x, const float *residual, float *out,
                            int64_t rows, int64_t embed, const struct fh_attention_layer *a, float *keys,
                            float *values, const struct fh_lineage *lineage) {
    (void)embed;
    const int64_t width = a->heads * a->head_dim;
    float *q = scratch(2 * aligned(rows * width));
    if (!q) return 2;
    float *attended = q + aligned(rows * width);
    const int64_t position = (lineage->length - 1) * lineage->rows0 * width;
    int status = linear(blas, x, rows, &a->q, q);
    if (!status) status = linear(blas, x, rows, &a->k, keys + position);
    if (!status) status = linear(blas, x, rows, &a->v, values + position);
    const struct fh_lineage written = {keys, values, lineage->ancestors, lineage->anc_stride, lineage->rows0,
                                       lineage->length};
    if (!status) status = step_attention(q, rows, a->heads, a->head_dim, 0, &written, &a->attending, attended);
    return project_out(blas, status, attended, rows, &a->out, residual, out, q);
}

int cross_attention_sublayer(const struct fh_blas *blas, const float *x, const float *residual, float *out,
                             int64_t rows, int64_t embed, const struct fh_attention_layer *a,
                             const struct fh_source *source) {
    (void)embed;
    const int64_t width = a->heads * a->head_dim;
    float *q = scratch(2 * aligned(rows * width));
    if (!q) return 2;
    float *attended = q + aligned(rows * width);
    int status = linear(blas, x, rows, &a->q, q);
    if (!status) status = step_attention(q, rows, a->heads, a->head_dim, source, 0, &a->attending, attended);
    return project_out(blas, status, attended, rows, &a->out, residual, out, q);
}

int feed_forward_sublayer(const struct fh_blas *blas, const float *x, const float *residual, float *out, int64_t rows,
                          int64_t embed, const struct fh_linear *fc1, const struct fh_linear *fc2) {
    const int64_t hidden = fc1->out;
    float *h = scratch(rows * hidden);
    if (!h) return 2;
    int status = linear(blas, x, rows, fc1, h);
    if (!status) {
        for (int64_t i = 0; i < rows * hidden; ++i) h[i] = h[i] < 0.0f ? 0.0f : h[i]; /* NaN stays NaN */
        status = linear(blas, h, rows, fc2, out);
    }
    if (!status) add_residual(out, residual, rows * embed);
    free(h);
    return status;
}

/* fairseq's residual block around one sublayer, `x` updated in place:
 * post-norm x = norm(x + body(x)); pre-norm x = x + body(norm(x)).
 * `body` writes residual + sublayer(input) into `summed`. */
#define RESIDUAL_BLOCK(NORM, CALL)                                                                     \
    do {                                                                                               \
        const float *input = x;                                                                        \
        if (pre_norm) {                                                                                \
            status = layer_norm(x, rows, embed, (NORM).weight, (NORM).bias, (NORM).eps, variant, normed); \
            input = normed;                                                                            \
            if (status) break;                                                                         \
        }                                                                                              \
        status = (CALL);                                                                               \
        if (status) break;                                                                             \
        if (pre_norm) {                                                                                \
            float *swap = x; x = summed; summed = swap;                                                \
        } else {                                                                                       \
            status = layer_norm(summed, rows, embed, (NORM).weight, (NORM).bias, (NORM).eps, variant, x); \
        }                                                                                              \
    } while (0)

/* Each layer as fairseq's TransformerDecoderLayer with no optional part:
 * self-attention over the lineage caches, cross-attention over the
 * encoder's cached keys and values, the feed-forward network (ReLU), each a
 * residual block. */
int decoder_step(const struct fh_blas *blas, const float *features, float *out, int64_t rows, int64_t embed,
                 const struct fh_decoder_layer *layers, int64_t n_layers, int pre_norm, const int64_t *ancestors,
                 int64_t anc_stride, int64_t rows0, int64_t length, const struct fh_norm *last_norm,
                 struct fh_norm_variant variant) {
    const int64_t n = rows * embed;
    float *memory = scratch(3 * aligned(n));
    if (!memory) return 2;
    float *x = memory, *summed = memory + aligned(n), *normed = memory + 2 * aligned(n);
    memcpy(x, features, n * sizeof *x);
    const struct fh_lineage lineage = {0, 0, ancestors, anc_stride, rows0, length};
    int status = 0;
    for (int64_t i = 0; i < n_layers && !status; ++i) {
        const struct fh_decoder_layer *layer = layers + i;
        RESIDUAL_BLOCK(layer->self_norm, self_attention_sublayer(blas, input, x, summed, rows, embed,
                                                                 &layer->self_attention, layer->keys,
                                                                 layer->values, &lineage));
        if (status) break;
        RESIDUAL_BLOCK(layer->cross_norm, cross_attention_sublayer(blas, input, x, summed, rows, embed,
                                                                   &layer->cross_attention, &layer->source));
        if (status) break;
        RESIDUAL_BLOCK(layer->final_norm,
                       feed_forward_sublayer(blas, input, x, summed, rows, embed, &layer->fc1, &layer->fc2));
    }
    if (!status) {
        if (last_norm)
            status = layer_norm(x, rows, embed, last_norm->weight, last_norm->bias, last_norm->eps, variant, out);
        else
            memcpy(out, x, n * sizeof *x);
    }
    free(memory);
    return status;
}
#undef RESIDUAL_BLOCK
