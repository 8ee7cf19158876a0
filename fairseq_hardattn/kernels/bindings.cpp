// The native library's Python module (fairseq_hardattn.kernels): each
// kernel of native.h as a function of tensors, checked here (dtype, device,
// shape, contiguity) and run with the GIL released; the decoder's layers as
// objects made once per decoding call; the header's constants as the
// module's tables. The native search is search.cpp's, the encoder
// encoder.cpp's.
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "native.h"
#include "module.h"

namespace py = pybind11;

namespace fairseq_hardattn {

void require(bool ok, const std::string &what) {
    if (!ok) throw py::value_error(what);
}

void check_tensor(const at::Tensor &t, at::ScalarType dtype, const char *name, bool contiguous) {
    require(t.device().is_cpu(), std::string(name) + ": a CPU tensor");
    require(t.scalar_type() == dtype, std::string(name) + ": dtype " + c10::toString(dtype) + ", got " +
                                          c10::toString(t.scalar_type()));
    require(!contiguous || t.is_contiguous(), std::string(name) + ": a contiguous tensor");
}

const fh_blas *torch_blas() {
    // PyTorch's own BLAS, the one its float32 Linear calls on a CPU (this
    // library links PyTorch's, which exports it); NULL where it does not
    static const fh_blas blas = [] {
        fh_blas found{};
        found.threads = +[]() -> int { return at::get_num_threads(); };
        found.gemm = reinterpret_cast<fh_gemm_fn>(dlsym(RTLD_DEFAULT, "sgemm_"));
        found.gemv = reinterpret_cast<fh_gemv_fn>(dlsym(RTLD_DEFAULT, "sgemv_"));
        if (!found.gemm || !found.gemv) {
            void *torch_cpu = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
            if (torch_cpu) {
                found.gemm = reinterpret_cast<fh_gemm_fn>(dlsym(torch_cpu, "sgemm_"));
                found.gemv = reinterpret_cast<fh_gemv_fn>(dlsym(torch_cpu, "sgemv_"));
            }
        }
        return found;
    }();
    return blas.gemm && blas.gemv ? &blas : nullptr;
}

const fh_blas &blas_or_raise() {
    const fh_blas *blas = torch_blas();
    require(blas != nullptr, "PyTorch's library exports no sgemm_/sgemv_ here");
    return *blas;
}

std::string &product_error() {
    thread_local std::string said;
    return said;
}

void raise_for_status(const char *name, int status) {
    if (status == 2) throw std::bad_alloc();
    if (status == 3) throw std::runtime_error(std::string(name) + ": a Linear layer's product failed: " + product_error());
    if (status != 0)
        throw py::value_error(std::string(name) + ": k <= " + std::to_string(FH_STEP_MAX_K) +
                              " and at least one position to attend");
}

fh_linear linear_of(const LinearWeights &weights, std::vector<at::Tensor> &kept) {
    const auto &[weight, bias] = weights;
    check_tensor(weight, at::kFloat, "a Linear weight", true);
    require(weight.dim() == 2, "a Linear weight: (out, in)");
    fh_linear linear{weight.data_ptr<float>(), nullptr, weight.size(0), weight.size(1), nullptr, nullptr};
    kept.push_back(weight);
    if (bias) {
        check_tensor(*bias, at::kFloat, "a Linear bias", true);
        require(bias->numel() == weight.size(0), "a Linear bias: (out,)");
        linear.bias = bias->data_ptr<float>();
        kept.push_back(*bias);
    }
    return linear;
}

PackedLinear::PackedLinear(at::Tensor packed, std::optional<at::Tensor> bias, int64_t in, int64_t out)
    : packed(std::move(packed)), bias(std::move(bias)), in(in), out(out) {
    require(!this->bias || this->bias->numel() == out, "a packed Linear's bias: (out,)");
}

at::Tensor PackedLinear::operator()(const at::Tensor &x, const std::vector<int64_t> &padded) const {
    const int64_t rows = x.size(0);
    require(rows < static_cast<int64_t>(padded.size()), "the padded rows of every row count");
    const int64_t target = padded[rows];
    at::Tensor input = target == rows ? x : at::cat({x, at::zeros({target - rows, in}, x.options())});
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    torch::jit::Stack stack{input, packed, bias ? c10::IValue(*bias) : c10::IValue(), c10::IValue(std::string("none")),
                            c10::IValue(c10::List<std::optional<at::Scalar>>()), c10::IValue(std::string(""))};
    op.callBoxed(&stack);
    at::Tensor y = stack[0].toTensor();
    return target == rows ? y : y.narrow(0, 0, rows);
}

Int8Linear::Int8Linear(const at::Tensor &weight, std::optional<at::Tensor> bias) : bias(std::move(bias)) {
    check_tensor(weight, at::kFloat, "an int8 layer's float32 weight", true);
    require(weight.dim() == 2, "an int8 layer's weight: (out, in)");
    const int64_t out = weight.size(0), in = weight.size(1);
    const int64_t out_p = (out + FH_INT8_BLOCK - 1) / FH_INT8_BLOCK * FH_INT8_BLOCK;
    packed = at::empty({int8_packed_bytes(out, in)}, at::kChar);
    scales = at::empty({out_p}, at::kFloat);
    sums = at::empty({out_p}, at::kInt);
    int8_pack(weight.data_ptr<float>(), out, in, packed.data_ptr<int8_t>(), scales.data_ptr<float>(),
              sums.data_ptr<int32_t>());
    if (this->bias) {
        check_tensor(*this->bias, at::kFloat, "an int8 layer's bias", true);
        require(this->bias->numel() == out, "an int8 layer's bias: (out,)");
    }
    linear = fh_int8_linear{packed.data_ptr<int8_t>(), scales.data_ptr<float>(), sums.data_ptr<int32_t>(),
                            this->bias ? this->bias->data_ptr<float>() : nullptr, out, in};
}

Int8Linear::Int8Linear(const Int8Linear &whole, const at::Tensor &rows) {
    check_tensor(rows, at::kLong, "the rows", true);
    const int64_t n = rows.numel(), in = whole.linear.in;
    const int64_t n_p = (n + FH_INT8_BLOCK - 1) / FH_INT8_BLOCK * FH_INT8_BLOCK;
    require(n == 0 || (rows.min().item<int64_t>() >= 0 && rows.max().item<int64_t>() < whole.linear.out),
            "rows of the layer");
    packed = at::empty({int8_packed_bytes(n, in)}, at::kChar);
    scales = at::empty({n_p}, at::kFloat);
    sums = at::empty({n_p}, at::kInt);
    int8_rows(&whole.linear, rows.data_ptr<int64_t>(), n, packed.data_ptr<int8_t>(), scales.data_ptr<float>(),
              sums.data_ptr<int32_t>());
    if (whole.bias) bias = whole.bias->index_select(0, rows).contiguous();
    linear = fh_int8_linear{packed.data_ptr<int8_t>(), scales.data_ptr<float>(), sums.data_ptr<int32_t>(),
                            bias ? bias->data_ptr<float>() : nullptr, n, in};
}

at::Tensor Int8Linear::operator()(const at::Tensor &x) const {
    check_tensor(x, at::kFloat, "an int8 layer's input", false);
    require(x.dim() >= 1 && x.size(-1) == linear.in, "an int8 layer's input: (..., in)");
    const at::Tensor rows = x.reshape({-1, linear.in}).contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = linear.out;
    at::Tensor y = at::empty({rows.size(0), linear.out}, x.options());
    if (int8_product(const_cast<fh_int8_linear *>(&linear), rows.data_ptr<float>(), rows.size(0), y.data_ptr<float>()))
        throw std::bad_alloc();
    return y.view(shape);
}

at::Tensor apply(const LinearSpec &linear, const at::Tensor &x, const std::vector<int64_t> &padded) {
    if (const auto *weights = std::get_if<LinearWeights>(&linear))
        return at::linear(x, std::get<0>(*weights), std::get<1>(*weights));
    if (const auto *int8 = std::get_if<std::shared_ptr<Int8Linear>>(&linear)) return (**int8)(x);
    const PackedLinear &packed = *std::get<std::shared_ptr<PackedLinear>>(linear);
    const int64_t width = x.size(-1), rows = x.numel() / width;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = packed.out;
    return packed(x.reshape({rows, width}), padded).view(shape);
}

// weight (out, in), any strides, packed for panel_product
static at::Tensor packed_panels(const at::Tensor &weight) {
    at::Tensor packed = at::empty({panel_floats(weight.size(0), weight.size(1))}, at::kFloat);
    panel_pack(weight.data_ptr<float>(), weight.size(0), weight.size(1), weight.stride(0), weight.stride(1),
               packed.data_ptr<float>());
    return packed;
}

fh_panels panels_of(const at::Tensor &weight, const std::optional<at::Tensor> &bias,
                    const std::function<at::Tensor(const at::Tensor &)> &reference, std::vector<at::Tensor> &kept) {
    const int64_t out = weight.size(0), in = weight.size(1);
    const at::Tensor packed = packed_panels(weight);
    const float *b = bias ? bias->data_ptr<float>() : nullptr;
    // the blocks tried: the whole inner dimension, the blocks MKL was seen to
    // use (192, 128), then the other multiples of 64
    std::vector<int64_t> blocks{in};
    for (int64_t block : {192, 128}) if (block < in) blocks.push_back(block);
    for (int64_t block = 64; block < in; block += 64)
        if (block != 192 && block != 128) blocks.push_back(block);
    c10::NoGradGuard no_grad;
    for (int64_t rows : {8, 4}) {
        // rows of varied values, none drawn from the process's generators
        const at::Tensor x =
            at::arange(rows * in, at::kFloat).mul_(0.7548776662f).frac_().sub_(0.5f).view({rows, in});
        const at::Tensor expected = reference(x);
        at::Tensor mine = at::empty({rows, out}, at::kFloat);
        for (int64_t block : blocks) {
            panel_product(packed.data_ptr<float>(), block, b, out, in, x.data_ptr<float>(), rows, mine.data_ptr<float>());
            if (at::equal(mine, expected)) {
                const at::Tensor checked = at::zeros({FH_PANEL_MAX_ROWS + 1}, at::kShort);
                kept.insert(kept.end(), {packed, checked});
                return fh_panels{packed.data_ptr<float>(), block, checked.data_ptr<int16_t>()};
            }
        }
    }
    return fh_panels{};
}

Panelled::Panelled(const at::Tensor &weight, std::optional<at::Tensor> bias,
                   std::function<at::Tensor(const at::Tensor &)> reference)
    : reference(std::move(reference)), bias(std::move(bias)), out(weight.size(0)), in(weight.size(1)) {
    panels = panels_of(weight, this->bias, this->reference, kept);
}

// panelled_product's reference: the Panelled's own, on rows of x
extern "C" int panelled_reference(void *context, const float *x, int64_t rows, float *y) {
    const auto *panelled = static_cast<const Panelled *>(context);
    return product_into(panelled->reference, panelled->in, panelled->out, x, rows, y);
}

at::Tensor Panelled::operator()(const at::Tensor &x) const {
    const int64_t rows = x.numel() / in;
    const int threads = panels.weight ? at::get_num_threads() : 0;
    if (panel_use(&panels, rows, threads) == FH_PANELS_NOT || x.scalar_type() != at::kFloat || !x.device().is_cpu())
        return reference(x);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = out;
    const at::Tensor flat = x.reshape({rows, in}).contiguous();
    at::Tensor y = at::empty({rows, out}, x.options());
    raise_for_status("a product of few rows",
                     panelled_product(&panels, bias ? bias->data_ptr<float>() : nullptr, out, in,
                                      flat.data_ptr<float>(), rows, threads, panelled_reference,
                                      const_cast<Panelled *>(this), y.data_ptr<float>()));
    return y.view(shape);
}

std::shared_ptr<Panelled> panelled_of(const LinearSpec &spec) {
    const auto *weights = std::get_if<LinearWeights>(&spec);
    if (!weights) return nullptr;
    const auto &[weight, bias] = *weights;
    check_tensor(weight, at::kFloat, "a Linear weight", true);
    return std::make_shared<Panelled>(weight, bias, [weight, bias](const at::Tensor &x) {
        return at::linear(x, weight, bias);
    });
}

at::Tensor apply(const LinearSpec &linear, const std::shared_ptr<Panelled> &panelled, const at::Tensor &x,
                 const std::vector<int64_t> &padded) {
    return panelled ? (*panelled)(x) : apply(linear, x, padded);
}

fh_linear linear_of(const LinearSpec &spec, std::vector<at::Tensor> &kept, Held &held) {
    if (const auto *weights = std::get_if<LinearWeights>(&spec)) {
        fh_linear linear = linear_of(*weights, kept);
        const auto &[weight, bias] = *weights;
        linear.panels = panels_of(weight, bias, [&](const at::Tensor &x) { return at::linear(x, weight, bias); }, kept);
        return linear;
    }
    if (const auto *int8 = std::get_if<std::shared_ptr<Int8Linear>>(&spec)) {
        held.int8.push_back(*int8);
        return fh_linear{nullptr, nullptr, (*int8)->linear.out, (*int8)->linear.in, int8_product, &(*int8)->linear};
    }
    const auto &layer = std::get<std::shared_ptr<PackedLinear>>(spec);
    held.packed.push_back(layer);
    return fh_linear{nullptr, nullptr, layer->out, layer->in, nullptr, layer.get()};
}

fh_norm norm_of(const NormWeights &weights, int64_t embed, std::vector<at::Tensor> &kept) {
    const auto &[weight, bias, eps] = weights;
    for (const at::Tensor *t : {&weight, &bias}) {
        check_tensor(*t, at::kFloat, "a LayerNorm's weight and bias", true);
        require(t->numel() == embed, "a LayerNorm over the features");
        kept.push_back(*t);
    }
    return fh_norm{weight.data_ptr<float>(), bias.data_ptr<float>(), static_cast<float>(eps)};
}

fh_norm_variant variant_of(const std::tuple<int, bool> &variant) {
    return fh_norm_variant{std::get<0>(variant), std::get<1>(variant) ? 1 : 0};
}

Source::Source(at::Tensor keys, std::optional<at::Tensor> keys_t, at::Tensor values,
               std::optional<at::Tensor> padding, int64_t group, std::optional<at::Tensor> sentences) {
    check_tensor(keys, at::kFloat, "source keys", false);
    check_tensor(values, at::kFloat, "source values", false);
    require(keys.dim() == 4 && keys.sizes() == values.sizes(), "source keys and values: (sentences, heads, len, dim)");
    if (keys.strides() != values.strides() || keys.stride(3) != 1) {
        keys = keys.contiguous();
        values = values.contiguous();
    }
    kept = {keys, values};
    part.keys = keys.data_ptr<float>();
    part.values = values.data_ptr<float>();
    part.sentence_stride = keys.stride(0);
    part.head_stride = keys.stride(1);
    part.position_stride = keys.stride(2);
    part.len = keys.size(2);
    part.group = group;
    if (keys_t) {
        check_tensor(*keys_t, at::kFloat, "transposed source keys", true);
        part.keys_t = keys_t->data_ptr<float>();
        kept.push_back(*keys_t);
    }
    if (padding) {
        require(padding->scalar_type() == at::kBool || padding->scalar_type() == at::kByte,
                "source padding: bool");
        at::Tensor contiguous = padding->contiguous();
        part.padding = static_cast<const uint8_t *>(contiguous.data_ptr());
        kept.push_back(contiguous);
    }
    if (sentences) {
        check_tensor(*sentences, at::kLong, "the sentences' table", true);
        part.sentences = sentences->data_ptr<int64_t>();
        kept.push_back(*sentences);
    }
}

Attention::Attention(LinearSpec q, std::optional<LinearSpec> k, std::optional<LinearSpec> v, LinearSpec out,
                     int64_t heads, int64_t head_dim, double scale, int mode, int64_t top_k) {
    layer.q = linear_of(q, kept, held);
    if (k) layer.k = linear_of(*k, kept, held);
    if (v) layer.v = linear_of(*v, kept, held);
    layer.out = linear_of(out, kept, held);
    require(layer.q.out == heads * head_dim && layer.out.in == heads * head_dim, "heads x head_dim projections");
    require(mode >= 0 && mode < FH_ATTENTION_MODE_COUNT, "an attention mode of ATTENTION_MODES");
    layer.heads = heads;
    layer.head_dim = head_dim;
    layer.attending = fh_attending{mode, static_cast<float>(scale), top_k, nullptr, 0.0f, 1.0f};
}

FeedForward::FeedForward(LinearSpec fc1, LinearSpec fc2) {
    first = linear_of(fc1, kept, held);
    second = linear_of(fc2, kept, held);
    require(first.out == second.in, "fc1's outputs are fc2's inputs");
}

DecoderLayers::DecoderLayers(bool pre_norm, std::tuple<int, bool> variant, std::optional<NormWeights> last_norm,
                             int64_t embed)
    : pre_norm(pre_norm), variant(variant_of(variant)), embed(embed) {
    if (last_norm) this->last_norm = norm_of(*last_norm, embed, kept);
}

void DecoderLayers::add(const Attention &self_attention, const Attention &cross_attention,
                        const FeedForward &feed_forward, const NormWeights &self_norm, const NormWeights &cross_norm,
                        const NormWeights &final_norm) {
    require(self_attention.layer.k.in && self_attention.layer.v.in, "self-attention's k and v projections");
    fh_decoder_layer layer{};
    layer.self_attention = self_attention.layer;
    layer.cross_attention = cross_attention.layer;
    layer.fc1 = feed_forward.first;
    layer.fc2 = feed_forward.second;
    layer.self_norm = norm_of(self_norm, embed, kept);
    layer.cross_norm = norm_of(cross_norm, embed, kept);
    layer.final_norm = norm_of(final_norm, embed, kept);
    for (const auto *part : {&self_attention.kept, &cross_attention.kept, &feed_forward.kept})
        kept.insert(kept.end(), part->begin(), part->end());
    for (const auto *part : {&self_attention.held, &cross_attention.held, &feed_forward.held}) {
        held.packed.insert(held.packed.end(), part->packed.begin(), part->packed.end());
        held.int8.insert(held.int8.end(), part->int8.begin(), part->int8.end());
    }
    layers.push_back(layer);
}

namespace {

at::Tensor features_checked(const at::Tensor &x, int64_t embed, const char *name) {
    check_tensor(x, at::kFloat, name, true);
    require(x.dim() == 2 && x.size(1) == embed, std::string(name) + ": (rows, embed)");
    return x;
}

fh_lineage lineage_of(const at::Tensor &keys, const at::Tensor &values, const at::Tensor &ancestors, int64_t length,
                      int64_t rows) {
    check_tensor(keys, at::kFloat, "lineage keys", true);
    check_tensor(values, at::kFloat, "lineage values", true);
    check_tensor(ancestors, at::kLong, "ancestors", false);
    require(keys.dim() == 4 && keys.sizes() == values.sizes(), "lineage caches: (capacity, rows0, heads, dim)");
    require(ancestors.dim() == 2 && ancestors.stride(1) == 1 && ancestors.size(0) >= rows &&
                ancestors.size(1) >= length && length <= keys.size(0),
            "ancestors: (>= rows, >= length), rows contiguous");
    return fh_lineage{keys.data_ptr<float>(), values.data_ptr<float>(), ancestors.data_ptr<int64_t>(),
                      ancestors.stride(0), keys.size(1), length};
}

void step_attention_binding(const at::Tensor &q, at::Tensor &out, int mode, double scale, int64_t k,
                            const std::optional<Source> &source, const std::optional<at::Tensor> &keys,
                            const std::optional<at::Tensor> &values, const std::optional<at::Tensor> &ancestors,
                            int64_t length, const std::optional<at::Tensor> &centres, double window,
                            double gaussian) {
    check_tensor(q, at::kFloat, "q", true);
    check_tensor(out, at::kFloat, "out", true);
    require(q.dim() == 3 && out.sizes() == q.sizes(), "q and out: (rows, heads, dim)");
    const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
    require(mode >= 0 && mode < FH_ATTENTION_MODE_COUNT, "an attention mode of ATTENTION_MODES");
    fh_lineage lineage{};
    if (keys) {
        require(values && ancestors, "the lineage's keys, values and ancestors");
        lineage = lineage_of(*keys, *values, *ancestors, length, rows);
    }
    fh_attending attending{mode, static_cast<float>(scale), k, nullptr, static_cast<float>(window),
                           static_cast<float>(gaussian)};
    if (centres) {
        check_tensor(*centres, at::kFloat, "centres", true);
        require(centres->numel() == rows * heads, "centres: (rows, heads)");
        attending.centres = centres->data_ptr<float>();
    }
    require(mode != FH_MODE_LOCAL || (centres && source), "local attention: its centres and a source");
    int status;
    {
        py::gil_scoped_release released;
        status = step_attention(q.data_ptr<float>(), rows, heads, dim, source ? &source->part : nullptr,
                                keys ? &lineage : nullptr, &attending, out.data_ptr<float>());
    }
    raise_for_status("step_attention", status);
}

void flexible_band_binding(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                           const std::optional<at::Tensor> &padding, const at::Tensor &centre, const at::Tensor &gate,
                           int64_t beam, int64_t heads, double scaling, double sigma, double two_tau,
                           double penalty_coef, at::Tensor &out, at::Tensor &new_centre, at::Tensor &scored) {
    for (const at::Tensor *t : std::initializer_list<const at::Tensor *>{&q, &k, &v, &centre, &gate, &out, &new_centre})
        check_tensor(*t, at::kFloat, "flexible_band_step's float32 tensors", true);
    check_tensor(scored, at::kLong, "scored", true);
    require(q.dim() == 2 && k.dim() == 3 && k.sizes() == v.sizes() && k.size(2) == q.size(1),
            "q (rows, head_dim); k, v (kv_rows, src_len, head_dim)");
    const uint8_t *padded = nullptr;
    at::Tensor padding_kept;
    if (padding) {
        padding_kept = padding->contiguous();
        padded = static_cast<const uint8_t *>(padding_kept.data_ptr());
    }
    int status;
    {
        py::gil_scoped_release released;
        status = flexible_band_step(q.data_ptr<float>(), q.size(0), q.size(1), static_cast<float>(scaling),
                                    k.data_ptr<float>(), v.data_ptr<float>(), k.size(1), padded, beam, heads,
                                    centre.data_ptr<float>(), gate.data_ptr<float>(), static_cast<float>(sigma),
                                    static_cast<float>(two_tau), static_cast<float>(penalty_coef),
                                    out.data_ptr<float>(), new_centre.data_ptr<float>(), scored.data_ptr<int64_t>());
    }
    if (status != 0) throw std::bad_alloc();
}

void beam_candidates_binding(const at::Tensor &logits, const at::Tensor &columns, const at::Tensor &adds, int64_t k,
                             at::Tensor &top_vals, at::Tensor &top_idx, at::Tensor &lse) {
    check_tensor(logits, at::kFloat, "logits", false);
    require(logits.dim() == 2 && logits.stride(1) == 1, "logits: (rows, vocab), rows contiguous");
    check_tensor(columns, at::kLong, "special columns", true);
    check_tensor(adds, at::kFloat, "special adds", true);
    require(columns.numel() == adds.numel(), "a value to add to each special column");
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    require(k >= 1 && k <= vocab, "1 <= k <= vocab");
    check_tensor(top_vals, at::kFloat, "top values", false);
    check_tensor(top_idx, at::kLong, "top indices", false);
    check_tensor(lse, at::kFloat, "normalisers", false);
    require(top_vals.size(0) == rows && top_vals.size(1) == k && top_vals.stride(0) == k && top_vals.stride(1) == 1 &&
                top_idx.size(0) == rows && top_idx.size(1) == k && top_idx.stride(0) == k && top_idx.stride(1) == 1 &&
                lse.numel() == rows && (rows < 2 || lse.stride(0) == 1),
            "outputs: (rows, k) contiguous, and (rows, 1)");
    py::gil_scoped_release released;
    beam_candidates(logits.data_ptr<float>(), rows, vocab, logits.stride(0), columns.data_ptr<int64_t>(),
                    adds.data_ptr<float>(), columns.numel(), k, top_vals.data_ptr<float>(),
                    top_idx.data_ptr<int64_t>(), lse.data_ptr<float>());
}

void ensemble_log_probs_binding(const std::vector<at::Tensor> &logits, at::Tensor &out) {
    require(!logits.empty(), "the models' logits");
    std::vector<int64_t> addresses, strides;
    for (const at::Tensor &x : logits) {
        check_tensor(x, at::kFloat, "a model's logits", false);
        require(x.dim() == 2 && x.stride(1) == 1 && x.sizes() == logits[0].sizes(),
                "each model's logits: (rows, vocab), rows contiguous");
        addresses.push_back(reinterpret_cast<int64_t>(x.data_ptr<float>()));
        strides.push_back(x.stride(0));
    }
    check_tensor(out, at::kFloat, "out", true);
    require(out.sizes() == logits[0].sizes(), "out: (rows, vocab)");
    int status;
    {
        py::gil_scoped_release released;
        status = ensemble_log_probs(addresses.data(), strides.data(), static_cast<int64_t>(logits.size()),
                                    out.size(0), out.size(1), out.data_ptr<float>());
    }
    raise_for_status("ensemble_log_probs", status);
}

void read_back_binding(const at::Tensor &step_tokens, const at::Tensor &step_scores, const at::Tensor &step_parents,
                       const at::Tensor &rows, int64_t step, at::Tensor &tokens, at::Tensor &scores) {
    check_tensor(step_tokens, at::kLong, "step tokens", true);
    check_tensor(step_scores, at::kFloat, "step scores", true);
    check_tensor(step_parents, at::kLong, "step parents", true);
    check_tensor(rows, at::kLong, "rows", true);
    check_tensor(tokens, at::kLong, "tokens", true);
    check_tensor(scores, at::kFloat, "scores", true);
    require(step_scores.sizes() == step_tokens.sizes() && step_parents.sizes() == step_tokens.sizes() &&
                step_tokens.size(0) >= step && tokens.size(0) == rows.numel() && tokens.size(1) == step + 1 &&
                scores.sizes() == tokens.sizes(),
            "histories (steps, stride); tokens and scores (n, step + 1)");
    py::gil_scoped_release released;
    read_back(step_tokens.data_ptr<int64_t>(), step_scores.data_ptr<float>(), step_parents.data_ptr<int64_t>(),
              step_tokens.stride(0), rows.data_ptr<int64_t>(), rows.numel(), step, tokens.data_ptr<int64_t>(),
              scores.data_ptr<float>());
}

at::Tensor layer_norm_binding(const at::Tensor &x, const at::Tensor &weight, const at::Tensor &bias, double eps,
                              std::tuple<int, bool> variant) {
    check_tensor(x, at::kFloat, "x", true);
    require(x.dim() == 2, "x: (rows, n)");
    std::vector<at::Tensor> kept;
    const fh_norm norm = norm_of({weight, bias, eps}, x.size(1), kept);
    at::Tensor y = at::empty_like(x);
    int status;
    {
        py::gil_scoped_release released;
        status = layer_norm(x.data_ptr<float>(), x.size(0), x.size(1), norm.weight, norm.bias, norm.eps,
                            variant_of(variant), y.data_ptr<float>());
    }
    require(status == 0, "layer_norm: 8 or 16 lanes");
    return y;
}

at::Tensor linear_product_binding(const at::Tensor &x, const LinearWeights &weights) {
    const fh_blas &blas = blas_or_raise();
    std::vector<at::Tensor> kept;
    const fh_linear linear = linear_of(weights, kept);
    features_checked(x, linear.in, "x");
    at::Tensor y = at::empty({x.size(0), linear.out}, x.options());
    py::gil_scoped_release released;
    linear_product(&blas, x.data_ptr<float>(), x.size(0), &linear, y.data_ptr<float>());
    return y;
}

at::Tensor panel_product_binding(const at::Tensor &x, const at::Tensor &weight, const std::optional<at::Tensor> &bias,
                                 int64_t block) {
    check_tensor(weight, at::kFloat, "weight", false);
    require(weight.dim() == 2 && block >= 1, "weight: (out, in); a block of at least 1");
    const int64_t out = weight.size(0), in = weight.size(1);
    features_checked(x, in, "x");
    if (bias) check_tensor(*bias, at::kFloat, "bias", true);
    require(!bias || bias->numel() == out, "bias: (out,)");
    const at::Tensor packed = packed_panels(weight);
    at::Tensor y = at::empty({x.size(0), out}, x.options());
    panel_product(packed.data_ptr<float>(), block, bias ? bias->data_ptr<float>() : nullptr, out, in,
                  x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
    return y;
}

// A sublayer kernel's call: x and residual (rows, embed) checked, the GIL
// released while `run` writes residual + the sublayer into out
template <class Run>
at::Tensor sublayer(const char *name, const at::Tensor &x, const at::Tensor &residual, int64_t embed, bool packed,
                    Run run) {
    features_checked(x, embed, "x");
    features_checked(residual, embed, "residual");
    require(!packed, "float32 Linear layers (packed ones run in the native search)");
    at::Tensor out = at::empty_like(residual);
    int status;
    {
        py::gil_scoped_release released;
        status = run(out.data_ptr<float>());
    }
    raise_for_status(name, status);
    return out;
}

at::Tensor self_attention_sublayer_binding(const Attention &attention, const at::Tensor &x, const at::Tensor &residual,
                                           at::Tensor &keys, at::Tensor &values, const at::Tensor &ancestors,
                                           int64_t length) {
    const fh_blas &blas = blas_or_raise();
    require(attention.layer.k.weight && attention.layer.v.weight, "self-attention's k and v projections");
    const int64_t rows = x.size(0), embed = attention.layer.q.in;
    const fh_lineage lineage = lineage_of(keys, values, ancestors, length, rows);
    require(length >= 1 && keys.size(1) >= rows && keys.size(2) == attention.layer.heads &&
                keys.size(3) == attention.layer.head_dim,
            "lineage caches of the attention's heads, this step's position written");
    return sublayer("self_attention_sublayer", x, residual, embed, !attention.held.packed.empty(), [&](float *out) {
        return self_attention_sublayer(&blas, x.data_ptr<float>(), residual.data_ptr<float>(), out, rows, embed,
                                       &attention.layer, keys.data_ptr<float>(), values.data_ptr<float>(), &lineage);
    });
}

at::Tensor cross_attention_sublayer_binding(const Attention &attention, const at::Tensor &x,
                                            const at::Tensor &residual, const Source &source) {
    const fh_blas &blas = blas_or_raise();
    const int64_t embed = attention.layer.q.in;
    return sublayer("cross_attention_sublayer", x, residual, embed, !attention.held.packed.empty(), [&](float *out) {
        return cross_attention_sublayer(&blas, x.data_ptr<float>(), residual.data_ptr<float>(), out, x.size(0), embed,
                                        &attention.layer, &source.part);
    });
}

at::Tensor feed_forward_sublayer_binding(const FeedForward &feed_forward, const at::Tensor &x,
                                         const at::Tensor &residual) {
    const fh_blas &blas = blas_or_raise();
    const int64_t embed = feed_forward.first.in;
    return sublayer("feed_forward_sublayer", x, residual, embed, !feed_forward.held.packed.empty(), [&](float *out) {
        return feed_forward_sublayer(&blas, x.data_ptr<float>(), residual.data_ptr<float>(), out, x.size(0), embed,
                                     &feed_forward.first, &feed_forward.second);
    });
}

at::Tensor decoder_step_binding(DecoderLayers &decoder, const at::Tensor &features,
                                const std::vector<std::tuple<at::Tensor, at::Tensor>> &caches,
                                const std::vector<Source> &sources, const at::Tensor &ancestors, int64_t length) {
    const fh_blas &blas = blas_or_raise();
    features_checked(features, decoder.embed, "features");
    require(decoder.held.packed.empty(), "float32 Linear layers (packed ones run in the native search)");
    const int64_t rows = features.size(0), n = static_cast<int64_t>(decoder.layers.size());
    require(static_cast<int64_t>(caches.size()) == n && static_cast<int64_t>(sources.size()) == n,
            "each layer's caches and source");
    int64_t rows0 = 0, anc_stride = 0;
    for (int64_t i = 0; i < n; ++i) {
        const auto &[keys, values] = caches[i];
        const fh_lineage lineage = lineage_of(keys, values, ancestors, length, rows);
        rows0 = lineage.rows0;
        anc_stride = lineage.anc_stride;
        decoder.layers[i].keys = keys.data_ptr<float>();
        decoder.layers[i].values = values.data_ptr<float>();
        decoder.layers[i].source = sources[i].part;
    }
    at::Tensor out = at::empty_like(features);
    int status;
    {
        py::gil_scoped_release released;
        status = decoder_step(&blas, features.data_ptr<float>(), out.data_ptr<float>(), rows, decoder.embed,
                              decoder.layers.data(), n, decoder.pre_norm, ancestors.data_ptr<int64_t>(), anc_stride,
                              rows0, length, decoder.last_norm ? &*decoder.last_norm : nullptr, decoder.variant);
    }
    raise_for_status("decoder_step", status);
    return out;
}

at::Tensor sentence_generators_binding(const std::vector<uint64_t> &seeds) {
    at::Tensor states = at::empty({static_cast<int64_t>(seeds.size()), FH_GENERATOR_STATE_WORDS}, at::kInt);
    py::gil_scoped_release released;
    seed_generators(seeds.data(), static_cast<int64_t>(seeds.size()),
                    reinterpret_cast<uint32_t *>(states.data_ptr<int32_t>()));
    return states;
}

void exponential_draws_binding(at::Tensor &states, at::Tensor &out) {
    check_tensor(states, at::kInt, "states", true);
    require(states.dim() == 2 && states.size(1) == FH_GENERATOR_STATE_WORDS, "states: (n, GENERATOR_STATE_WORDS)");
    require(out.is_contiguous() && (out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble),
            "exponential_draws: contiguous float32 or float64 draws, contiguous states");
    const int64_t n = states.size(0);
    const int64_t per = n ? out.numel() / n : 0;
    py::gil_scoped_release released;
    exponential_draws(reinterpret_cast<uint32_t *>(states.data_ptr<int32_t>()), n, per,
                      out.scalar_type() == at::kFloat, out.data_ptr());
}

}  // namespace
}  // namespace fairseq_hardattn

PYBIND11_MODULE(_native, m) {
    using namespace fairseq_hardattn;
    m.doc() = "fairseq-hardattn's native kernels (native.h) and search (search.cpp)";
    py::dict modes;
#define FH_MODE_ENTRY(name, text) modes[text] = static_cast<int>(FH_MODE_##name);
    FH_ATTENTION_MODES(FH_MODE_ENTRY)
#undef FH_MODE_ENTRY
    m.attr("ATTENTION_MODES") = modes;
    m.attr("STEP_MAX_K") = static_cast<int>(FH_STEP_MAX_K);
    m.attr("SOURCE_BLOCK") = static_cast<int>(FH_SOURCE_BLOCK);
    m.attr("GENERATOR_STATE_WORDS") = static_cast<int>(FH_GENERATOR_STATE_WORDS);
    m.def("has_blas", [] { return torch_blas() != nullptr; });

    py::class_<Source>(m, "Source", "an attention step's source part: the encoder's keys and values per sentence")
        .def(py::init<at::Tensor, std::optional<at::Tensor>, at::Tensor, std::optional<at::Tensor>, int64_t,
                      std::optional<at::Tensor>>(),
             py::kw_only(), py::arg("keys"), py::arg("keys_t"), py::arg("values"), py::arg("padding"),
             py::arg("group"), py::arg("sentences"));
    py::class_<PackedLinear, std::shared_ptr<PackedLinear>>(m, "PackedLinear",
                                                            "oneDNN's packed float32 Linear layer")
        .def(py::init<at::Tensor, std::optional<at::Tensor>, int64_t, int64_t>(), py::kw_only(), py::arg("packed"),
             py::arg("bias"), py::arg("in_features"), py::arg("out_features"));
    py::class_<Int8Linear, std::shared_ptr<Int8Linear>>(m, "Int8Linear",
                                                        "an int8 Linear layer: weights quantized per row, "
                                                        "activations per row at each product")
        .def(py::init<const at::Tensor &, std::optional<at::Tensor>>(), py::arg("weight"), py::arg("bias"))
        .def(py::init<const Int8Linear &, const at::Tensor &>(), py::arg("whole"), py::arg("rows"))
        .def("__call__", &Int8Linear::operator(), py::arg("x"), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("out_features", [](const Int8Linear &l) { return l.linear.out; })
        .def_property_readonly("in_features", [](const Int8Linear &l) { return l.linear.in; });
    m.def(
        "int8_quantize_rows",
        [](const at::Tensor &x) {
            check_tensor(x, at::kFloat, "x", true);
            require(x.dim() == 2, "x: (rows, n)");
            at::Tensor quantized = at::empty(x.sizes(), at::kChar), scales = at::empty({x.size(0)}, at::kFloat);
            int8_quantize_rows(x.data_ptr<float>(), x.size(0), x.size(1), quantized.data_ptr<int8_t>(),
                               scales.data_ptr<float>());
            return std::make_tuple(quantized, scales);
        },
        py::arg("x"));
    py::class_<Attention>(m, "Attention", "an attention sublayer's projections, heads and mode")
        .def(py::init<LinearSpec, std::optional<LinearSpec>, std::optional<LinearSpec>, LinearSpec, int64_t, int64_t,
                      double, int, int64_t>(),
             py::kw_only(), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("heads"),
             py::arg("head_dim"), py::arg("scale"), py::arg("mode"), py::arg("top_k"));
    py::class_<FeedForward>(m, "FeedForward", "a feed-forward sublayer's Linear layers (ReLU between)")
        .def(py::init<LinearSpec, LinearSpec>(), py::kw_only(), py::arg("fc1"), py::arg("fc2"));
    py::class_<DecoderLayers>(m, "DecoderLayers", "a decoder's layers and norms as decoder_step reads them")
        .def(py::init<bool, std::tuple<int, bool>, std::optional<NormWeights>, int64_t>(), py::kw_only(),
             py::arg("pre_norm"), py::arg("norm_variant"), py::arg("last_norm"), py::arg("embed"))
        .def("add", &DecoderLayers::add, py::kw_only(), py::arg("self_attention"), py::arg("cross_attention"),
             py::arg("feed_forward"), py::arg("self_norm"), py::arg("cross_norm"), py::arg("final_norm"));

    m.def("step_attention", &step_attention_binding, py::kw_only(), py::arg("q"), py::arg("out"), py::arg("mode"),
          py::arg("scale"), py::arg("k"), py::arg("source"), py::arg("keys"), py::arg("values"),
          py::arg("ancestors"), py::arg("length"), py::arg("centres"), py::arg("window"), py::arg("gaussian"));
    m.def("step_attention_threads", [](int64_t rows, int64_t heads, int64_t dim, int64_t positions) {
        return step_attention_threads(rows, heads, dim, positions);
    });
    m.def("flexible_band_step", &flexible_band_binding, py::kw_only(), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("padding"), py::arg("centre"), py::arg("gate"), py::arg("beam"), py::arg("heads"),
          py::arg("scaling"), py::arg("sigma"), py::arg("two_tau"), py::arg("penalty_coef"), py::arg("out"),
          py::arg("new_centre"), py::arg("scored"));
    m.def("beam_candidates", &beam_candidates_binding, py::arg("logits"), py::arg("columns"), py::arg("adds"),
          py::arg("k"), py::arg("top_vals"), py::arg("top_idx"), py::arg("lse"));
    m.def("ensemble_log_probs", &ensemble_log_probs_binding, py::arg("logits"), py::arg("out"));
    m.def("read_back", &read_back_binding, py::arg("step_tokens"), py::arg("step_scores"), py::arg("step_parents"),
          py::arg("rows"), py::arg("step"), py::arg("tokens"), py::arg("scores"));
    m.def("layer_norm", &layer_norm_binding, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
          py::arg("variant"));
    m.def("linear_product", &linear_product_binding, py::arg("x"), py::arg("linear"));
    m.def("panel_product", &panel_product_binding, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("block"));
    py::class_<Panelled, std::shared_ptr<Panelled>>(m, "Panelled", "F.linear on panel_linear.c's kernel where it gives its bits")
        .def(py::init([](const at::Tensor &weight, const std::optional<at::Tensor> &bias) {
                 return panelled_of(LinearWeights{weight, bias});
             }),
             py::arg("weight"), py::arg("bias"))
        .def("__call__", &Panelled::operator(), py::arg("x"))
        .def_property_readonly("block", [](const Panelled &p) -> std::optional<int64_t> {
            return p.panels.weight ? std::optional<int64_t>(p.panels.block) : std::nullopt;
        })
        .def("checked", [](const Panelled &p, int64_t rows) {
            require(p.panels.weight && rows >= 0 && rows <= FH_PANEL_MAX_ROWS, "rows of a layer with panels");
            return static_cast<int>(p.panels.checked[rows]);
        }, py::arg("rows"));
    m.attr("PANEL_MAX_ROWS") = static_cast<int>(FH_PANEL_MAX_ROWS);
    m.def("self_attention_sublayer", &self_attention_sublayer_binding, py::arg("attention"), py::arg("x"),
          py::arg("residual"), py::arg("keys"), py::arg("values"), py::arg("ancestors"), py::arg("length"));
    m.def("cross_attention_sublayer", &cross_attention_sublayer_binding, py::arg("attention"), py::arg("x"),
          py::arg("residual"), py::arg("source"));
    m.def("feed_forward_sublayer", &feed_forward_sublayer_binding, py::arg("feed_forward"), py::arg("x"),
          py::arg("residual"));
    m.def("decoder_step", &decoder_step_binding, py::arg("layers"), py::arg("features"), py::arg("caches"),
          py::arg("sources"), py::arg("ancestors"), py::arg("length"));
    m.def("sentence_generators", &sentence_generators_binding, py::arg("seeds"));
    m.def("exponential_draws", &exponential_draws_binding, py::arg("states"), py::arg("out"));
    register_search(m);
    register_encoder(m);
}
