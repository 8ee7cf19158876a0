/* fairseq-hardattn's native library: every function of it that another
 * file calls, declared once. Each kernel's source includes this header, so
 * the compiler checks its definitions against these declarations, and the
 * Python module (bindings.cpp) and the native search (search.cpp) call them
 * through it: no prototype is written twice, no constant mirrored by hand
 * (the enums below reach Python as the module's own tables).
 *
 * Conventions: float32 features, row-major; sizes int64_t; a pointer may be
 * NULL where its description says so. Functions returning int return 0 on
 * success, 1 on arguments they do not support, 2 where scratch memory could
 * not be allocated, 3 where a product of another library failed. */
#ifndef FAIRSEQ_HARDATTN_NATIVE_H
#define FAIRSEQ_HARDATTN_NATIVE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How an attention step attends: an attention class's kernel mode (its
 * name, as the class declares it, then its constant). */
#define FH_ATTENTION_MODES(X) X(SOFT, "soft") X(HARD, "hard") X(TOPK, "topk") X(LOCAL, "local")
#define FH_MODE_CONSTANT(name, text) FH_MODE_##name,
enum fh_attention_mode { FH_ATTENTION_MODES(FH_MODE_CONSTANT) FH_ATTENTION_MODE_COUNT };
#undef FH_MODE_CONSTANT

/* the most keys top-k attention keeps in a step (a fixed array) */
enum { FH_STEP_MAX_K = 64 };
/* the source positions of a block of step_attention's transposed keys */
enum { FH_SOURCE_BLOCK = 16 };
/* words of one sentence generator's state (sentence_draws.c) */
enum { FH_GENERATOR_STATE_WORDS = 626 };

/* The float32 BLAS functions PyTorch's CPU Linear calls (Fortran
 * interface), found in PyTorch's own library by the caller. */
typedef void (*fh_gemm_fn)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                           const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                           const float *beta, float *c, const int *ldc);
typedef void (*fh_gemv_fn)(const char *trans, const int *m, const int *n, const float *alpha, const float *a,
                           const int *lda, const float *x, const int *incx, const float *beta, float *y,
                           const int *incy);
struct fh_blas {
    fh_gemm_fn gemm;
    fh_gemv_fn gemv;
    int (*threads)(void); /* the threads its products run on now (PyTorch's setting) */
};

/* ---- attention steps (step_attention.c) ---- */

/* An attention step's source part: the encoder's keys and values of each
 * cached sentence, read in place (len 0: none). */
struct fh_source {
    const float *keys;   /* (sentences, heads, len, dim) with the strides below, in floats */
    const float *keys_t; /* the keys as (sentences, heads, dim, len rounded up to FH_SOURCE_BLOCK),
                            contiguous, zeros beyond len; soft and top-k read these */
    const float *values; /* the keys' strides */
    int64_t sentence_stride, head_stride, position_stride;
    const uint8_t *padding; /* (sentences, len), nonzero where padded; or NULL */
    int64_t len;
    int64_t group;            /* hypotheses per sentence: row r reads sentence r / group... */
    const int64_t *sentences; /* ...or sentences[r / group] where given */
};

/* An attention step's lineage part: a hypothesis's earlier keys and values
 * where each step wrote them (length 0: none). */
struct fh_lineage {
    const float *keys, *values; /* (capacity, rows0, heads, dim) */
    const int64_t *ancestors;   /* (rows, >= length), row stride anc_stride: the row of each position */
    int64_t anc_stride, rows0, length;
};

/* How a step attends: its mode, scale, top-k's k; local attention's window
 * (centres (rows, heads), its half width and 2 sigma^2). */
struct fh_attending {
    int mode;
    float scale;
    int64_t k;
    const float *centres;
    float window, gaussian;
};

/* q, out: (rows, heads, dim). Returns 0; 1 where k > FH_STEP_MAX_K or
 * nothing is to be attended; 2 without scratch memory. */
int step_attention(const float *q, int64_t rows, int64_t heads, int64_t dim, const struct fh_source *source,
                   const struct fh_lineage *lineage, const struct fh_attending *attending, float *out);
/* the threads step_attention splits such a step over */
int step_attention_threads(int64_t rows, int64_t heads, int64_t dim, int64_t positions);

/* ---- flexible attention's band (flexible_band.c) ---- */
int flexible_band_step(const float *q, int64_t rows, int64_t head_dim, float scaling, const float *k, const float *v,
                       int64_t src_len, const uint8_t *padding, int64_t beam, int64_t heads, const float *centre,
                       const float *gate, float sigma, float two_tau, float penalty_coef, float *out,
                       float *new_centre, int64_t *scored);

/* ---- the search's passes over the vocabulary (beam_candidates.c) ---- */

/* logits (rows, vocab), row stride `stride`; the special columns `cols`
 * count with `adds` added (NAN: never chosen) in the choice, raw in the
 * normaliser. Out: top_vals, top_idx (rows, k), descending, ties the lower
 * index first; lse (rows). */
void beam_candidates(const float *logits, int64_t rows, int64_t vocab, int64_t stride, const int64_t *cols,
                     const float *adds, int64_t nspecial, int64_t k, float *top_vals, int64_t *top_idx, float *lse);
/* fairseq's EnsembleModel's log-probabilities: `logits` the models'
 * (rows, vocab) logits as addresses, each with its row stride. */
int ensemble_log_probs(const int64_t *logits, const int64_t *strides, int64_t models, int64_t rows, int64_t vocab,
                       float *out);
/* Finished hypotheses read back along the search's back-pointers
 * (step_tokens, step_scores, step_parents: (steps, stride)); see there. */
void read_back(const int64_t *step_tokens, const float *step_scores, const int64_t *step_parents, int64_t stride,
               const int64_t *rows, int64_t n, int64_t step, int64_t *tokens, float *scores);

/* ---- PyTorch's LayerNorm, operation for operation (layer_norm.c) ---- */

/* (lanes, fused): the vector width PyTorch's kernel ran at and whether its
 * compiler fused a product and a sum; the caller finds the pair that gives
 * F.layer_norm's bits. */
struct fh_norm_variant {
    int lanes, fused;
};
/* y (rows, n) = F.layer_norm(x, (n,), gamma, beta, eps); y may be x.
 * Returns 0, 1 where lanes is not 8 or 16. */
int layer_norm(const float *x, int64_t rows, int64_t n, const float *gamma, const float *beta, float eps,
               struct fh_norm_variant variant, float *y);

/* ---- float32 products of few rows in the BLAS's order (panel_linear.c) ---- */

enum { FH_PANEL_WIDTH = 16 /* output rows packed together */, FH_PANEL_MAX_ROWS = 1024 };
/* A Linear layer's weight packed for panel_product (weight NULL: none),
 * with the block of the inner dimension the BLAS sums in, and for each row
 * count up to FH_PANEL_MAX_ROWS whether panel_product gave the BLAS's bits:
 * checked[rows] t > 0 under t threads, -t not, 0 not tried. */
struct fh_panels {
    const float *weight;
    int64_t block;
    int16_t *checked; /* (FH_PANEL_MAX_ROWS + 1) */
};
enum { FH_PANELS_NOT, FH_PANELS_USE, FH_PANELS_CHECK };
/* floats of a packed weight of out x in */
int64_t panel_floats(int64_t out, int64_t in);
/* w (out, in), element (o, k) at w[o * out_stride + k * in_stride], packed */
void panel_pack(const float *w, int64_t out, int64_t in, int64_t out_stride, int64_t in_stride, float *panels);
/* y (rows, out) = b + x (rows, in) w^T, the sum blocks of `block` inner
 * indices, each from zero in order, added to the bias (or zero) in turn */
void panel_product(const float *panels, int64_t block, const float *bias, int64_t out, int64_t in, const float *x,
                   int64_t rows, float *y);
/* FH_PANELS_USE where panel_product gives the BLAS's bits for `rows` rows
 * on `threads` threads, FH_PANELS_NOT where it does not (or none is
 * packed), FH_PANELS_CHECK where untried */
int panel_use(const struct fh_panels *panels, int64_t rows, int threads);
/* A product made by other code (the BLAS as PyTorch calls it, oneDNN's
 * packed kernel, an int8 one): y (rows, out) of x (rows, in); returns 0,
 * or 3 where it failed. */
typedef int (*fh_product_fn)(void *context, const float *x, int64_t rows, float *y);
/* y (rows, out) = x w^T + b: panel_product where panel_use says so, else
 * `reference`'s product; where untried, the reference's, and whether
 * panel_product gave its bits recorded for `rows` and `threads`. Returns
 * 0, the reference's status, or 2 without memory for the check. */
int panelled_product(const struct fh_panels *panels, const float *bias, int64_t out, int64_t in, const float *x,
                     int64_t rows, int threads, fh_product_fn reference, void *context, float *y);

/* ---- a decoder layer's sublayers (decoder_sublayers.c) ---- */

/* A float32 Linear layer's weight (out, in) and bias (out) or NULL, its
 * products PyTorch's BLAS calls, or panel_product with the BLAS's bits
 * where `panels` holds a packed weight; or, where `product` is set, that
 * function's, given `context`. */
struct fh_linear {
    const float *weight, *bias;
    int64_t out, in;
    fh_product_fn product;
    void *context;
    struct fh_panels panels;
};
struct fh_norm {
    const float *weight, *bias;
    float eps;
};
struct fh_attention_layer {
    struct fh_linear q, k, v, out; /* k and v: self-attention only */
    int64_t heads, head_dim;
    struct fh_attending attending;
};
/* fairseq's TransformerDecoderLayer without optional parts (ReLU). */
struct fh_decoder_layer {
    struct fh_attention_layer self_attention, cross_attention;
    struct fh_linear fc1, fc2;
    struct fh_norm self_norm, cross_norm, final_norm;
    float *keys, *values;   /* self-attention's lineage caches (capacity, rows0, heads, head_dim) */
    struct fh_source source; /* cross-attention's encoder part */
};

/* y (rows, out) = x (rows, in) w^T + b as PyTorch's F.linear computes it
 * (or the layer's own product) */
int linear_product(const struct fh_blas *blas, const float *x, int64_t rows, const struct fh_linear *linear,
                   float *y);
/* out = residual + the sublayer of x (rows, embed); self-attention writes
 * this step's keys and values at position lineage->length - 1. */
int self_attention_sublayer(const struct fh_blas *blas, const float *x, const float *residual, float *out,
                            int64_t rows, int64_t embed, const struct fh_attention_layer *attention, float *keys,
                            float *values, const struct fh_lineage *lineage);
int cross_attention_sublayer(const struct fh_blas *blas, const float *x, const float *residual, float *out,
                             int64_t rows, int64_t embed, const struct fh_attention_layer *attention,
                             const struct fh_source *source);
int feed_forward_sublayer(const struct fh_blas *blas, const float *x, const float *residual, float *out, int64_t rows,
                          int64_t embed, const struct fh_linear *fc1, const struct fh_linear *fc2);
/* The decoder's layers for one step: features (rows, embed) in, the last
 * layer's output (then last_norm where not NULL) out; pre-norm or
 * post-norm residual blocks, layer norms as `variant`. The lineage's
 * ancestors and length are the step's; each layer's caches its own. */
int decoder_step(const struct fh_blas *blas, const float *features, float *out, int64_t rows, int64_t embed,
                 const struct fh_decoder_layer *layers, int64_t n_layers, int pre_norm, const int64_t *ancestors,
                 int64_t anc_stride, int64_t rows0, int64_t length, const struct fh_norm *last_norm,
                 struct fh_norm_variant variant);

/* ---- int8 Linear layers (int8_linear.c) ---- */

/* Weights quantized per output row and activations per input row at each
 * product, both symmetric to [-127, 127]; the integer sums are exact, so a
 * product is the same on every CPU (AVX-512 VNNI, AVX2 or neither):
 * y[r][o] = (float)(sum_k xq[r][k] wq[o][k]) * (sx[r] * sw[o]) + b[o]. */
enum { FH_INT8_BLOCK = 16 /* output rows packed together */ };
struct fh_int8_linear {
    const int8_t *weight; /* [out rounded up to FH_INT8_BLOCK / FH_INT8_BLOCK][in rounded up to 4 / 4]
                             [FH_INT8_BLOCK][4], zeros beyond out and in */
    const float *scales;  /* (out rounded up) each row's scale, 0 beyond out */
    const int32_t *sums;  /* (out rounded up) 128 x each row's sum of its int8 weights */
    const float *bias;    /* (out) or NULL */
    int64_t out, in;
};
/* bytes of a packed weight of out x in */
int64_t int8_packed_bytes(int64_t out, int64_t in);
/* rows of x (rows, n) quantized: xq (rows, n), scales (rows); a row that
 * is not finite has scale NAN */
void int8_quantize_rows(const float *x, int64_t rows, int64_t n, int8_t *xq, float *scales);
/* w (out, in) quantized per row and packed into weight, scales, sums
 * (int8_packed_bytes, and out rounded up floats and int32s) */
void int8_pack(const float *w, int64_t out, int64_t in, int8_t *weight, float *scales, int32_t *sums);
/* the output rows `rows` (n of them) of a packed layer, packed as a layer
 * of their own (its scales and sums too): a shortlist's logits */
void int8_rows(const struct fh_int8_linear *linear, const int64_t *rows, int64_t n, int8_t *weight, float *scales,
               int32_t *sums);
/* an fh_product_fn: `context` an fh_int8_linear; rows whose scale is NAN
 * give NAN; returns 0, 2 without scratch memory */
int int8_product(void *context, const float *x, int64_t rows, float *y);

/* ---- sampling's generators, PyTorch's bit for bit (sentence_draws.c) ---- */
void seed_generators(const uint64_t *seeds, int64_t n, uint32_t *states);
/* row i of out (n rows of `per`; float32 where `single`, else float64) from generator i */
void exponential_draws(uint32_t *states, int64_t n, int64_t per, int single, void *out);

#ifdef __cplusplus
}
#endif

#endif
