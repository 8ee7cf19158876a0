// fairseq's Transformer encoder layers as one native call: the PyTorch
// operators fairseq's TransformerEncoderLayer and its multi-head attention
// call (torch's multi_head_attention_forward without weights:
// scaled_dot_product_attention), in the same order on tensors of the same
// shapes and strides, so the same bits, without the Python around each of
// them, which costs more than their arithmetic for a sentence or a few.
// decoding/native_search.py says which encoders it takes.
#include <cmath>
#include <limits>

#include <c10/core/GradMode.h>

#include "module.h"

namespace py = pybind11;

namespace fairseq_hardattn {
namespace {

at::Tensor norm(const at::Tensor &x, const NormWeights &weights) {
    const auto &[weight, bias, eps] = weights;
    return at::layer_norm(x, {x.size(-1)}, weight, bias, eps, true);
}

struct EncoderLayer {
    // the attention's products, their few rows (a sentence or a few) on
    // panel_linear.c's kernel; the feed-forward's too where they are plain
    std::shared_ptr<Panelled> q, k, v, out;
    LinearSpec fc1, fc2;
    std::shared_ptr<Panelled> fc1_panels, fc2_panels;
    NormWeights self_norm, final_norm;
    int64_t heads;
};

class Encoder {
  public:
    Encoder(bool pre_norm, std::optional<NormWeights> last_norm) : pre_norm_(pre_norm), last_norm_(last_norm) {}

    void add(LinearWeights q, LinearWeights k, LinearWeights v, LinearWeights out, LinearSpec fc1, LinearSpec fc2,
             NormWeights self_norm, NormWeights final_norm, int64_t heads) {
        require(heads >= 1 && std::get<0>(q).size(0) % heads == 0, "heads that divide the features");
        layers_.push_back({panelled_of(q), panelled_of(k), panelled_of(v), panelled_of(out), fc1, fc2,
                           panelled_of(fc1), panelled_of(fc2), self_norm, final_norm, heads});
    }

    // The layers' (and the last norm's) output of x (src_len, sentences,
    // features); padding (sentences, src_len) where a sentence has any
    at::Tensor operator()(at::Tensor x, const std::optional<at::Tensor> &padding, std::vector<int64_t> padded) const {
        check_tensor(x, at::kFloat, "the encoder's embeddings", false);
        require(x.dim() == 3, "the encoder's embeddings: (src_len, sentences, features)");
        py::gil_scoped_release released;
        c10::NoGradGuard no_grad;
        for (const EncoderLayer &layer : layers_) {
            at::Tensor residual = x;
            if (pre_norm_) x = norm(x, layer.self_norm);
            x = residual + self_attention(layer, x, padding);
            if (!pre_norm_) x = norm(x, layer.self_norm);
            residual = x;
            if (pre_norm_) x = norm(x, layer.final_norm);
            x = apply(layer.fc2, layer.fc2_panels, at::relu(apply(layer.fc1, layer.fc1_panels, x, padded)), padded);
            x = residual + x;
            if (!pre_norm_) x = norm(x, layer.final_norm);
        }
        return last_norm_ ? norm(x, *last_norm_) : x;
    }

  private:
    // torch's multi_head_attention_forward with separate projections, no
    // weights returned, no attention mask but the key padding's
    static at::Tensor self_attention(const EncoderLayer &layer, const at::Tensor &x,
                                     const std::optional<at::Tensor> &padding) {
        const int64_t tgt_len = x.size(0), bsz = x.size(1), embed = x.size(2), heads = layer.heads;
        const int64_t head_dim = embed / heads;
        at::Tensor q = (*layer.q)(x);
        at::Tensor k = (*layer.k)(x);
        at::Tensor v = (*layer.v)(x);
        std::optional<at::Tensor> mask;
        if (padding) {
            const int64_t src_len = padding->size(1);
            at::Tensor additive = at::zeros_like(*padding, x.options()).masked_fill_(
                *padding, -std::numeric_limits<double>::infinity());
            mask = additive.view({bsz, 1, 1, src_len}).expand({-1, heads, -1, -1}).reshape({bsz * heads, 1, src_len});
            mask = mask->size(0) == 1 ? mask->unsqueeze(0) : mask->view({bsz, heads, -1, src_len});
        }
        q = q.view({tgt_len, bsz * heads, head_dim}).transpose(0, 1);
        k = k.view({k.size(0), bsz * heads, head_dim}).transpose(0, 1);
        v = v.view({v.size(0), bsz * heads, head_dim}).transpose(0, 1);
        const int64_t src_len = k.size(1);
        q = q.view({bsz, heads, tgt_len, head_dim});
        k = k.view({bsz, heads, src_len, head_dim});
        v = v.view({bsz, heads, src_len, head_dim});
        at::Tensor attended = at::scaled_dot_product_attention(q, k, v, mask, 0.0, false);
        attended = attended.permute({2, 0, 1, 3}).reshape({bsz * tgt_len, embed});
        attended = (*layer.out)(attended);
        return attended.view({tgt_len, bsz, attended.size(1)});
    }

    bool pre_norm_;
    std::optional<NormWeights> last_norm_;
    std::vector<EncoderLayer> layers_;
};

}  // namespace

void register_encoder(py::module_ &m) {
    py::class_<Encoder>(m, "Encoder", "fairseq's Transformer encoder layers as one call")
        .def(py::init<bool, std::optional<NormWeights>>(), py::kw_only(), py::arg("pre_norm"), py::arg("last_norm"))
        .def("add", &Encoder::add, py::kw_only(), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
             py::arg("fc1"), py::arg("fc2"), py::arg("self_norm"), py::arg("final_norm"), py::arg("heads"))
        .def("__call__", &Encoder::operator(), py::arg("x"), py::arg("padding"), py::arg("padded_rows"));
}

}  // namespace fairseq_hardattn
