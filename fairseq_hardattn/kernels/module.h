// The C++ side of the native library's Python module, shared by its two
// files: bindings.cpp (the kernels of native.h as functions of tensors)
// and search.cpp (the native search). The types hold the tensors whose
// memory the kernels' structs point into.
#ifndef FAIRSEQ_HARDATTN_MODULE_H
#define FAIRSEQ_HARDATTN_MODULE_H

#include <ATen/ATen.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "native.h"

namespace fairseq_hardattn {

// a Linear layer's (weight, bias or None); a LayerNorm's (weight, bias, eps)
using LinearWeights = std::tuple<at::Tensor, std::optional<at::Tensor>>;
using NormWeights = std::tuple<at::Tensor, at::Tensor, double>;

// oneDNN's packed float32 Linear (decoding/packed_linear.py's
// PackedProduct): its packed weight and bias, called on rows padded to the
// few shapes of decoding/row_shapes.py (`padded[rows]`, a table the caller
// gives)
struct PackedLinear {
    PackedLinear(at::Tensor packed, std::optional<at::Tensor> bias, int64_t in, int64_t out);
    at::Tensor operator()(const at::Tensor &x, const std::vector<int64_t> &padded) const;
    at::Tensor packed;
    std::optional<at::Tensor> bias;
    int64_t in, out;
};
// An int8 Linear layer (int8_linear.c): its weights quantized and packed once
struct Int8Linear {
    Int8Linear(const at::Tensor &weight, std::optional<at::Tensor> bias);
    Int8Linear(const Int8Linear &whole, const at::Tensor &rows);  // some of its output rows
    // y (..., out) of x (..., in), float32 (the caller holds the GIL or not)
    at::Tensor operator()(const at::Tensor &x) const;
    at::Tensor packed, scales, sums;
    std::optional<at::Tensor> bias;
    fh_int8_linear linear{};
};
// a Linear layer as the kernels take it: float32 weights, a packed one or an int8 one
using LinearSpec = std::variant<LinearWeights, std::shared_ptr<PackedLinear>, std::shared_ptr<Int8Linear>>;

// ValueError(what) unless ok
void require(bool ok, const std::string &what);
// ValueError unless a CPU tensor of dtype (and contiguous where asked)
void check_tensor(const at::Tensor &t, at::ScalarType dtype, const char *name, bool contiguous);
// PyTorch's own BLAS, or NULL where its library exports none
const fh_blas *torch_blas();
// an attention kernel's status as Python's error (MemoryError, ValueError)
void raise_for_status(const char *name, int status);
fh_linear linear_of(const LinearWeights &weights, std::vector<at::Tensor> &kept);
// a packed layer's fh_linear: its sizes and `context` the PackedLinear; its
// product is set by the native search, which gives the padded rows. An int8
// layer's: its product and its fh_int8_linear (the layer kept in `int8`)
// A Linear layer's product of x (..., in) as the model's Python makes it:
// F.linear on its weights; on a packed layer (its forward) the rows of x
// flattened and padded (row_shapes.py's in_few_shapes); an int8 layer's
at::Tensor apply(const LinearSpec &linear, const at::Tensor &x, const std::vector<int64_t> &padded);

struct Held {
    std::vector<std::shared_ptr<PackedLinear>> packed;
    std::vector<std::shared_ptr<Int8Linear>> int8;
};
// A float32 layer's panels (panel_linear.c), the weight (out, in) packed and
// the BLAS's block found against `reference` (the product the panels
// replace); none (weight NULL) where no block gives its bits. `kept` holds
// their memory.
fh_panels panels_of(const at::Tensor &weight, const std::optional<at::Tensor> &bias,
                    const std::function<at::Tensor(const at::Tensor &)> &reference, std::vector<at::Tensor> &kept);
fh_linear linear_of(const LinearSpec &spec, std::vector<at::Tensor> &kept, Held &held);  // a float32 layer with its panels

// A float32 Linear layer's product of x (..., in) as `reference` makes it
// (at::linear, or the mm the projection stands for): panel_product's for
// the row counts where it gives reference's bits, checked once per row
// count and thread count; reference's for the others.
struct Panelled {
    Panelled(const at::Tensor &weight, std::optional<at::Tensor> bias,
             std::function<at::Tensor(const at::Tensor &)> reference);
    at::Tensor operator()(const at::Tensor &x) const;
    std::function<at::Tensor(const at::Tensor &)> reference;
    std::optional<at::Tensor> bias;
    int64_t out, in;
    fh_panels panels{};
    std::vector<at::Tensor> kept;
};
// a plain float32 layer's Panelled (its reference at::linear); else nullptr
std::shared_ptr<Panelled> panelled_of(const LinearSpec &spec);
// apply(), by `panelled` where given
at::Tensor apply(const LinearSpec &linear, const std::shared_ptr<Panelled> &panelled, const at::Tensor &x,
                 const std::vector<int64_t> &padded);
fh_norm norm_of(const NormWeights &weights, int64_t embed, std::vector<at::Tensor> &kept);

struct Source {
    Source(at::Tensor keys, std::optional<at::Tensor> keys_t, at::Tensor values, std::optional<at::Tensor> padding,
           int64_t group, std::optional<at::Tensor> sentences);
    fh_source part{};
    std::vector<at::Tensor> kept;
};

struct Attention {
    Attention(LinearSpec q, std::optional<LinearSpec> k, std::optional<LinearSpec> v, LinearSpec out, int64_t heads,
              int64_t head_dim, double scale, int mode, int64_t top_k);
    fh_attention_layer layer{};
    std::vector<at::Tensor> kept;
    Held held;
};

struct FeedForward {
    FeedForward(LinearSpec fc1, LinearSpec fc2);
    fh_linear first{}, second{};
    std::vector<at::Tensor> kept;
    Held held;
};

struct DecoderLayers {
    DecoderLayers(bool pre_norm, std::tuple<int, bool> variant, std::optional<NormWeights> last_norm, int64_t embed);
    void add(const Attention &self_attention, const Attention &cross_attention, const FeedForward &feed_forward,
             const NormWeights &self_norm, const NormWeights &cross_norm, const NormWeights &final_norm);
    std::vector<fh_decoder_layer> layers;
    int pre_norm;
    fh_norm_variant variant;
    int64_t embed;
    std::optional<fh_norm> last_norm;
    std::vector<at::Tensor> kept;
    Held held;
};

// what a product of another library that failed said (its status is 3)
std::string &product_error();

// An fh_product_fn's body for a product of tensors: y (rows, out) =
// product(x as a (rows, in) tensor); returns 0, or 3 with product_error()
// set where it failed.
template <class Product>
int product_into(const Product &product, int64_t in, int64_t out, const float *x, int64_t rows, float *y) {
    try {
        const at::Tensor input = at::from_blob(const_cast<float *>(x), {rows, in}, at::kFloat);
        const at::Tensor made = product(input).contiguous();
        require(made.numel() == rows * out, "a product of the rows, out values each");
        std::memcpy(y, made.data_ptr<float>(), made.numel() * sizeof(float));
        return 0;
    } catch (const std::exception &error) {
        product_error() = error.what();
        return 3;
    }
}

// search.cpp's and encoder.cpp's parts of the module
void register_search(pybind11::module_ &m);
void register_encoder(pybind11::module_ &m);

}  // namespace fairseq_hardattn

#endif
