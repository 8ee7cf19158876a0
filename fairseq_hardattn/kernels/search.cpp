// The plugin's beam search for one model as one native call per batch: the
// decoder's steps (embedding, layers and norms: decoder_step), the output
// projection (PyTorch's op, as the Python search calls it), each
// hypothesis's candidates and normaliser (beam_candidates), each sentence's
// best candidates, the finished hypotheses read back along the
// back-pointers, and the lineage's reorders (the table of ancestors; the
// encoder's keys and values stay per sentence) — with the GIL released.
//
// It is decoding/beam_search.py's search, step for step: the same
// operations on the same tensors in the same order, so the same hypotheses
// and scores, bit for bit (tests/unit/test_native_search.py). Sampling with
// one sample a sentence is decoding/sampling.py's draws, each sentence from
// its own generator (sentence_draws.c). What it does not run (several
// samples a sentence, a nucleus, an ensemble, a prefix, n-gram blocking, a
// shortlist, a layer or projection that is not plain float32) stays the
// Python search's.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "module.h"

namespace py = pybind11;

namespace fairseq_hardattn {
namespace {

// How a step's features become logits: oneDNN's packed Linear
// (``packed_linear.py``) or an int8 one, ``block`` rows at a time; or an
// ``mm`` with the output projection's weight transposed (the whole step at
// once; panel_linear.c's product with its bits for few rows).
struct Projection {
    Projection(std::optional<at::Tensor> transposed, std::shared_ptr<PackedLinear> packed,
               std::shared_ptr<Int8Linear> int8, int64_t block)
        : transposed(std::move(transposed)), packed(std::move(packed)), int8(std::move(int8)), block(block) {
        require(this->transposed.has_value() + (this->packed != nullptr) + (this->int8 != nullptr) == 1,
                "a transposed weight, a packed Linear or an int8 one");
        if (this->transposed) {
            check_tensor(*this->transposed, at::kFloat, "the projection's transposed weight", true);
            require(this->transposed->dim() == 2, "the (features, vocab) transposed weight");
            const at::Tensor t = *this->transposed;
            panelled = std::make_shared<Panelled>(t.t(), std::nullopt, [t](const at::Tensor &x) { return at::mm(x, t); });
        }
        require(block >= 1, "a block of rows");
    }

    // logits (rows, vocab) of features (rows, features), contiguous
    at::Tensor operator()(const at::Tensor &features, const std::vector<int64_t> &padded) const {
        if (int8) return (*int8)(features);
        return packed ? (*packed)(features, padded) : (*panelled)(features);
    }

    // whether the logits are made a block of rows at a time
    bool in_blocks() const { return packed || int8; }

    std::optional<at::Tensor> transposed;
    std::shared_ptr<PackedLinear> packed;
    std::shared_ptr<Int8Linear> int8;
    int64_t block;
    std::shared_ptr<Panelled> panelled;  // the transposed weight's mm
};

// A packed Linear's product within one search: its rows padded by the search's table.
struct PackedCall {
    const PackedLinear *linear;
    const std::vector<int64_t> *padded;
};

extern "C" int packed_call(void *context, const float *x, int64_t rows, float *y) {
    const auto *call = static_cast<const PackedCall *>(context);
    return product_into([call](const at::Tensor &input) { return (*call->linear)(input, *call->padded); },
                        call->linear->in, call->linear->out, x, rows, y);
}

// The search's settings (fairseq's SequenceGenerator's, as the Python search reads them).
struct Settings {
    int64_t beam, max_len, min_len, bos, eos, pad_token, pad_column, unk, vocab;
    double unk_penalty, temperature, len_penalty;
    bool normalize_scores;
    bool sampling;  // one sample a sentence (beam 1), among the `topk` most probable tokens (0: all)
    int64_t topk;
};

// One layer's encoder part: its cross-attention's keys and values of each
// sentence, as the modules' first step caches them.
struct SourceCache {
    at::Tensor keys, keys_t, values;
};

SourceCache project_source(const at::Tensor &encoder_out, const LinearSpec &k, const LinearSpec &v, int64_t heads,
                           int64_t head_dim, const std::vector<int64_t> &padded) {
    // (src_len, sentences, features) -> (sentences, heads, src_len, head_dim), contiguous
    const int64_t src_len = encoder_out.size(0), sentences = encoder_out.size(1);
    auto project = [&](const LinearSpec &linear) {
        const at::Tensor projected = apply(linear, encoder_out, padded);
        return projected.contiguous().view({src_len, sentences, heads, head_dim}).permute({1, 2, 0, 3}).contiguous();
    };
    SourceCache cache{project(k), at::Tensor(), project(v)};
    const int64_t whole_blocks = (src_len + FH_SOURCE_BLOCK - 1) / FH_SOURCE_BLOCK * FH_SOURCE_BLOCK;
    cache.keys_t = at::zeros({sentences, heads, head_dim, whole_blocks}, encoder_out.options());
    cache.keys_t.narrow(3, 0, src_len).copy_(cache.keys.transpose(2, 3));
    return cache;
}

struct Hypothesis {
    at::Tensor tokens, positional_scores;
    float score;
};

class BeamSearch {
  public:
    BeamSearch(DecoderLayers &decoder, const std::vector<std::tuple<LinearSpec, LinearSpec>> &source_weights,
               const at::Tensor &encoder_out, const std::optional<at::Tensor> &encoder_padding,
               const at::Tensor &embed_weight, double embed_scale, const std::optional<at::Tensor> &positions,
               const Projection &projection, std::vector<int64_t> padded, const Settings &settings,
               const std::optional<at::Tensor> &generators)
        : decoder_(decoder), projection_(projection), padded_(std::move(padded)), s_(settings), embed_(embed_weight),
          embed_scale_(static_cast<float>(embed_scale)) {
        check_tensor(encoder_out, at::kFloat, "the encoder's output", false);
        check_tensor(embed_weight, at::kFloat, "the embeddings", true);
        require(encoder_out.dim() == 3 && embed_weight.size(1) == decoder.embed,
                "the encoder's output (src_len, sentences, features), embeddings of the decoder's features");
        require(static_cast<size_t>(decoder.layers.size()) == source_weights.size(), "each layer's source projections");
        bsz_ = encoder_out.size(1);
        rows0_ = bsz_ * s_.beam;
        if (s_.sampling) {
            require(s_.beam == 1 && generators.has_value(), "sampling: one sample a sentence, each sentence's generator");
            check_tensor(*generators, at::kInt, "the sentences' generators", true);
            require(generators->dim() == 2 && generators->size(0) == bsz_ &&
                        generators->size(1) == FH_GENERATOR_STATE_WORDS,
                    "a generator state (GENERATOR_STATE_WORDS) per sentence");
            generators_ = *generators;
        }
        capacity_ = s_.max_len + 1;
        const at::Tensor encoder = encoder_out.contiguous();
        if (positions) {
            check_tensor(*positions, at::kFloat, "the positions", true);
            require(positions->size(0) >= capacity_ && positions->size(1) == decoder.embed,
                    "a position embedding for every step");
            positions_ = *positions;
        }
        if (encoder_padding) padding_ = encoder_padding->to(at::kBool).contiguous();
        layers_ = decoder.layers;
        for (fh_decoder_layer &layer : layers_)
            for (fh_linear *linear : {&layer.self_attention.q, &layer.self_attention.k, &layer.self_attention.v,
                                      &layer.self_attention.out, &layer.cross_attention.q, &layer.cross_attention.out,
                                      &layer.fc1, &layer.fc2})
                if (!linear->product && linear->context) {  // a packed Linear: its rows padded as this search pads
                    calls_.push_back(std::make_unique<PackedCall>(
                        PackedCall{static_cast<const PackedLinear *>(linear->context), &padded_}));
                    linear->product = packed_call;
                    linear->context = calls_.back().get();
                }
        for (size_t i = 0; i < layers_.size(); ++i) {
            fh_decoder_layer &layer = layers_[i];
            const fh_attention_layer &cross = layer.cross_attention, &self = layer.self_attention;
            sources_.push_back(project_source(encoder, std::get<0>(source_weights[i]), std::get<1>(source_weights[i]),
                                              cross.heads, cross.head_dim, padded_));
            lineage_keys_.push_back(at::empty({capacity_, rows0_, self.heads, self.head_dim}, encoder.options()));
            lineage_values_.push_back(at::empty_like(lineage_keys_.back()));
            const SourceCache &source = sources_.back();
            layer.keys = lineage_keys_.back().data_ptr<float>();
            layer.values = lineage_values_.back().data_ptr<float>();
            layer.source = fh_source{source.keys.data_ptr<float>(),
                                     source.keys_t.data_ptr<float>(),
                                     source.values.data_ptr<float>(),
                                     source.keys.stride(0),
                                     source.keys.stride(1),
                                     source.keys.stride(2),
                                     padding_.defined() ? static_cast<const uint8_t *>(padding_.data_ptr()) : nullptr,
                                     source.keys.size(2),
                                     1,
                                     nullptr};
        }
        const at::TensorOptions floats = encoder.options(), longs = floats.dtype(at::kLong);
        ancestors_ = at::empty({rows0_, capacity_}, longs);
        moved_ = at::empty_like(ancestors_);
        step_tokens_ = at::empty({capacity_, rows0_}, longs);
        step_scores_ = at::empty({capacity_, rows0_}, floats);
        step_parents_ = at::empty({capacity_, rows0_}, longs);
        features_ = at::empty({rows0_, decoder.embed}, floats);
        candidates_ = s_.sampling ? std::min<int64_t>(s_.topk, s_.vocab) : std::min<int64_t>(2 * s_.beam, s_.vocab);
        top_values_ = at::empty({rows0_, candidates_}, floats);
        top_tokens_ = at::empty({rows0_, candidates_}, longs);
        normalisers_ = at::empty({rows0_, 1}, floats);
        for (bool eos_blocked : {false, true}) {
            std::vector<int64_t> columns{s_.unk};
            std::vector<float> adds{static_cast<float>(-s_.unk_penalty)};
            if (s_.pad_column >= 0) {
                columns.push_back(s_.pad_column);
                adds.push_back(std::numeric_limits<float>::quiet_NaN());
            }
            if (eos_blocked) {
                columns.push_back(s_.eos);
                adds.push_back(std::numeric_limits<float>::quiet_NaN());
            }
            special_columns_[eos_blocked] = columns;
            special_adds_[eos_blocked] = adds;
        }
        finalized_.resize(bsz_);
    }

    std::vector<std::vector<Hypothesis>> run() {
        const int64_t beam = s_.beam;
        std::vector<int64_t> sentences(bsz_);  // the original index of each sentence still in the batch
        std::iota(sentences.begin(), sentences.end(), 0);
        int64_t bsz = bsz_, rows = bsz_;  // the first step: one row per sentence
        std::vector<int64_t> last(bsz_, s_.bos), order;
        std::vector<float> scores(rows0_, 0.0f);
        const int64_t first_candidates = std::min<int64_t>(2 * beam, s_.vocab - 1);
        const int64_t sentence_candidates = std::min<int64_t>(2 * beam, beam * s_.vocab - 1);
        std::vector<float> sentence_scores;
        std::vector<int64_t> cand_beams, cand_tokens;
        for (int64_t step = 0; step <= s_.max_len; ++step) {
            if (!order.empty()) reorder_ancestors(order);
            set_step(step, rows);
            const int64_t group = step == 0 ? 1 : beam;
            decode(last, rows, step, group, sentences);
            const int64_t width = s_.sampling ? beam : step == 0 ? first_candidates : sentence_candidates;
            if (s_.sampling) {
                sample(step, rows, sentences, scores, sentence_scores, cand_beams, cand_tokens);
            } else if (step < s_.max_len) {
                candidates(rows, step);
                select(step, bsz, rows, width, scores, sentence_scores, cand_beams, cand_tokens);
            } else {
                eos_only(step, bsz, rows, width, scores, sentence_scores, cand_beams, cand_tokens);
            }
            // hypotheses ending with EOS among each sentence's best `beam`: finished
            std::vector<uint8_t> eos(bsz * width);
            for (int64_t i = 0; i < bsz * width; ++i)
                eos[i] = cand_tokens[i] == s_.eos && sentence_scores[i] != -std::numeric_limits<float>::infinity();
            std::vector<int64_t> finished = finalize(step, bsz, width, eos, cand_beams, sentence_scores, sentences);
            if (static_cast<int64_t>(finished.size()) == bsz) break;
            require(step < s_.max_len, "the search ended every sentence by max_len");
            // each sentence continues with its best `beam` candidates not ending with EOS
            std::vector<int64_t> new_order, new_last;
            std::vector<float> new_scores;
            std::vector<int64_t> kept;
            for (int64_t b = 0; b < bsz; ++b) {
                const bool leaves = std::find(finished.begin(), finished.end(), sentences[b]) != finished.end();
                if (!leaves) kept.push_back(b);
                int64_t taken = 0;
                for (int pass = 0; pass < 2 && taken < beam; ++pass)
                    for (int64_t j = 0; j < width && taken < beam; ++j) {
                        if (eos[b * width + j] != pass) continue;
                        ++taken;
                        if (leaves) continue;
                        const int64_t at = b * width + j;
                        int64_t parent = cand_beams[at] + b * beam;
                        if (step == 0) parent /= beam;  // (one row per sentence: its beam starts)
                        new_order.push_back(parent);
                        new_last.push_back(cand_tokens[at]);
                        new_scores.push_back(sentence_scores[at]);
                    }
            }
            if (!finished.empty()) {
                std::vector<int64_t> still;
                for (int64_t b : kept) still.push_back(sentences[b]);
                sentences = still;
                bsz = static_cast<int64_t>(kept.size());
            }
            rows = bsz * beam;
            order = new_order;
            last = new_last;
            std::copy(new_scores.begin(), new_scores.end(), scores.begin());
            int64_t *tokens = step_tokens_[step].data_ptr<int64_t>(), *parents = step_parents_[step].data_ptr<int64_t>();
            float *step_scores = step_scores_[step].data_ptr<float>();
            for (int64_t r = 0; r < rows; ++r) {
                tokens[r] = last[r];
                step_scores[r] = scores[r];
                parents[r] = order[r];
            }
        }
        return std::move(finalized_);
    }

  private:
    void reorder_ancestors(const std::vector<int64_t> &order) {
        const int64_t *from = ancestors_.data_ptr<int64_t>();
        int64_t *to = moved_.data_ptr<int64_t>();
        for (size_t i = 0; i < order.size(); ++i)
            std::copy(from + order[i] * capacity_, from + order[i] * capacity_ + length_, to + i * capacity_);
        std::swap(ancestors_, moved_);
    }

    void set_step(int64_t step, int64_t rows) {
        int64_t *ancestors = ancestors_.data_ptr<int64_t>();
        for (int64_t r = 0; r < rows; ++r) ancestors[r * capacity_ + step] = r;
        length_ = step + 1;
    }

    // The decoder's features of each row's last token at `step` (rows, embed) into features_.
    void decode(const std::vector<int64_t> &last, int64_t rows, int64_t step, int64_t group,
                const std::vector<int64_t> &sentences) {
        const int64_t embed = decoder_.embed;
        at::Tensor x = at::empty({rows, embed}, features_.options());
        float *out = x.data_ptr<float>();
        const float *table = embed_.data_ptr<float>();
        const float *position = positions_.defined() ? positions_[step].data_ptr<float>() : nullptr;
        for (int64_t r = 0; r < rows; ++r) {
            // a hypothesis whose score is already -inf may end with pad: it reads EOS instead
            const int64_t token = last[r] == s_.pad_token ? s_.eos : last[r];
            const float *e = table + token * embed;
            float *o = out + r * embed;
            for (int64_t d = 0; d < embed; ++d) o[d] = embed_scale_ * e[d];
            if (position)
                for (int64_t d = 0; d < embed; ++d) o[d] += position[d];
        }
        std::vector<int64_t> cached(sentences.begin(), sentences.end());
        for (fh_decoder_layer &layer : layers_) {
            layer.source.group = group;
            layer.source.sentences = cached.data();
        }
        const fh_blas *blas = torch_blas();
        require(blas != nullptr, "PyTorch's BLAS");
        const int status = decoder_step(blas, out, features_.data_ptr<float>(), rows, embed, layers_.data(),
                                        static_cast<int64_t>(layers_.size()), decoder_.pre_norm,
                                        ancestors_.data_ptr<int64_t>(), capacity_, rows0_, length_,
                                        decoder_.last_norm ? &*decoder_.last_norm : nullptr, decoder_.variant);
        raise_for_status("decoder_step", status);
    }

    // Each row's best candidates and normaliser (top_values_, top_tokens_, normalisers_).
    void candidates(int64_t rows, int64_t step) {
        const bool eos_blocked = step < s_.min_len;
        const std::vector<int64_t> &columns = special_columns_[eos_blocked];
        const std::vector<float> &adds = special_adds_[eos_blocked];
        const at::Tensor features = features_.narrow(0, 0, rows);
        const int64_t block = projection_.in_blocks() ? projection_.block : std::max<int64_t>(rows, 1);
        require(rows < static_cast<int64_t>(padded_.size()) || !projection_.packed, "padded rows for every block");
        for (int64_t start = 0; start < rows; start += block) {
            const int64_t end = std::min(start + block, rows);
            at::Tensor logits = projection_(features.narrow(0, start, end - start), padded_);
            if (s_.temperature != 1.0) logits = at::div(logits, s_.temperature);
            require(logits.stride(1) == 1 && logits.size(1) == s_.vocab, "logits of the vocabulary, rows contiguous");
            beam_candidates(logits.data_ptr<float>(), end - start, s_.vocab, logits.stride(0), columns.data(),
                            adds.data(), static_cast<int64_t>(columns.size()), candidates_,
                            top_values_.data_ptr<float>() + start * candidates_,
                            top_tokens_.data_ptr<int64_t>() + start * candidates_,
                            normalisers_.data_ptr<float>() + start);
        }
    }

    // Each sentence's best candidates: (sentence_scores, cand_beams, cand_tokens) (bsz, width).
    void select(int64_t step, int64_t bsz, int64_t rows, int64_t width, const std::vector<float> &scores,
                std::vector<float> &sentence_scores, std::vector<int64_t> &cand_beams,
                std::vector<int64_t> &cand_tokens) {
        const int64_t k = candidates_, beam = s_.beam;
        const float *top = top_values_.data_ptr<float>(), *normaliser = normalisers_.data_ptr<float>();
        const int64_t *tokens = top_tokens_.data_ptr<int64_t>();
        sentence_scores.assign(bsz * width, 0.0f);
        cand_beams.assign(bsz * width, 0);
        cand_tokens.assign(bsz * width, 0);
        if (step == 0) {  // every hypothesis of a sentence is the same: its one row's candidates
            for (int64_t b = 0; b < bsz; ++b)
                for (int64_t j = 0; j < width; ++j) {
                    sentence_scores[b * width + j] = top[b * k + j] - normaliser[b];
                    cand_tokens[b * width + j] = tokens[b * k + j];
                }
            return;
        }
        // (lprobs + scores) per sentence, its best `width` as torch.topk orders them
        at::Tensor totals = at::empty({bsz, beam * k}, top_values_.options());
        float *t = totals.data_ptr<float>();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < k; ++j) t[r * k + j] = (top[r * k + j] - normaliser[r]) + scores[r];
        auto [best, picked] = at::topk(totals, width, 1);
        const float *values = best.data_ptr<float>();
        const int64_t *at = picked.data_ptr<int64_t>();
        for (int64_t b = 0; b < bsz; ++b)
            for (int64_t j = 0; j < width; ++j) {
                const int64_t i = b * width + j, candidate = at[i];
                sentence_scores[i] = values[i];
                cand_beams[i] = candidate / k;
                cand_tokens[i] = tokens[(b * beam + candidate / k) * k + candidate % k];
            }
    }

    // Sampling's step (decoding/sampling.py's SentenceDraws.step, one sample
    // a sentence): each row's draw among its log-probabilities (its `topk`
    // best, or all), `probs / q` at its largest with q the sentence's
    // generator's exponential draws (PyTorch's multinomial of one sample).
    void sample(int64_t step, int64_t rows, const std::vector<int64_t> &sentences, const std::vector<float> &scores,
                std::vector<float> &sentence_scores, std::vector<int64_t> &cand_beams,
                std::vector<int64_t> &cand_tokens) {
        at::Tensor probs, tokens;  // (rows, 1, drawn among); tokens undefined: every token, by its index
        if (step < s_.max_len && s_.topk > 0) {  // the kernel's candidates, as the Python search's
            candidates(rows, step);
            probs = at::exp(at::sub(top_values_.narrow(0, 0, rows), normalisers_.narrow(0, 0, rows)))
                        .view({rows, 1, candidates_});
            tokens = top_tokens_.narrow(0, 0, rows).view({rows, 1, candidates_});
        } else {
            const at::Tensor lprobs = log_probs(rows, step).view({rows, 1, s_.vocab});
            if (s_.topk > 0) {
                auto [values, best] = at::topk(lprobs, s_.topk);
                probs = at::exp(values);
                tokens = best;
            } else {
                probs = at::exp(lprobs);
            }
        }
        const int64_t among = probs.size(2);
        at::Tensor q = at::empty_like(probs, at::MemoryFormat::Contiguous);
        uint32_t *states = reinterpret_cast<uint32_t *>(generators_.data_ptr<int32_t>());
        for (int64_t r = 0; r < rows; ++r)
            exponential_draws(states + sentences[r] * FH_GENERATOR_STATE_WORDS, 1, among, 1,
                              q.data_ptr<float>() + r * among);
        const at::Tensor drawn = at::argmax(at::div(probs, q), 2).unsqueeze(2);
        const at::Tensor logs = at::log(at::gather(probs, 2, drawn)).contiguous();
        const at::Tensor picked = (tokens.defined() ? at::gather(tokens, 2, drawn) : drawn).contiguous();
        const float *log_prob = logs.data_ptr<float>();
        const int64_t *token = picked.data_ptr<int64_t>();
        sentence_scores.assign(rows, 0.0f);
        cand_beams.assign(rows, 0);
        cand_tokens.assign(rows, 0);
        for (int64_t r = 0; r < rows; ++r) {
            sentence_scores[r] = step == 0 ? log_prob[r] : log_prob[r] + scores[r];
            cand_tokens[r] = token[r];
        }
    }

    // A step's log-probabilities (rows, vocab), the special columns set on
    // the logits as the Python search's step sets them where it reads every
    // token's.
    at::Tensor log_probs(int64_t rows, int64_t step) {
        at::Tensor logits = projection_(features_.narrow(0, 0, rows), padded_);
        if (s_.temperature != 1.0) logits = at::div(logits, s_.temperature);
        const at::Tensor normaliser = at::logsumexp(logits, {1}, true);
        const double minus_inf = -std::numeric_limits<double>::infinity();
        if (s_.pad_column >= 0) logits.select(1, s_.pad_column).fill_(minus_inf);
        if (s_.unk_penalty != 0.0) logits.select(1, s_.unk).sub_(s_.unk_penalty);
        if (step >= s_.max_len) {
            logits.narrow(1, 0, s_.eos).fill_(minus_inf);
            logits.narrow(1, s_.eos + 1, s_.vocab - s_.eos - 1).fill_(minus_inf);
        } else if (step < s_.min_len) {
            logits.select(1, s_.eos).fill_(minus_inf);
        }
        return at::sub(logits, normaliser);
    }

    // The last step (max_len): every hypothesis ends with EOS, its
    // log-probability against PyTorch's logsumexp of the step's logits (the
    // Python search's step there); each row's other candidates are -inf.
    void eos_only(int64_t step, int64_t bsz, int64_t rows, int64_t width, const std::vector<float> &scores,
                  std::vector<float> &sentence_scores, std::vector<int64_t> &cand_beams,
                  std::vector<int64_t> &cand_tokens) {
        at::Tensor logits = projection_(features_.narrow(0, 0, rows), padded_);
        if (s_.temperature != 1.0) logits = at::div(logits, s_.temperature);
        const at::Tensor normaliser = at::logsumexp(logits, {1}, true).contiguous();
        const at::Tensor eos_logits = logits.select(1, s_.eos).contiguous();
        const float *lse = normaliser.data_ptr<float>(), *eos = eos_logits.data_ptr<float>();
        const float minus_inf = -std::numeric_limits<float>::infinity();
        const int64_t k = candidates_;
        sentence_scores.assign(bsz * width, minus_inf);
        cand_beams.assign(bsz * width, 0);
        cand_tokens.assign(bsz * width, -1);  // (-inf candidates: never read)
        if (step == 0) {  // one row per sentence
            for (int64_t b = 0; b < bsz; ++b) {
                sentence_scores[b * width] = eos[b] - lse[b];
                cand_tokens[b * width] = s_.eos;
            }
            return;
        }
        at::Tensor totals = at::full({bsz, rows / bsz * k}, minus_inf, logits.options());
        float *t = totals.data_ptr<float>();
        for (int64_t r = 0; r < rows; ++r) t[r * k] = (eos[r] - lse[r]) + scores[r];
        auto [best, picked] = at::topk(totals, width, 1);
        const float *values = best.data_ptr<float>();
        const int64_t *at = picked.data_ptr<int64_t>();
        for (int64_t i = 0; i < bsz * width; ++i) {
            sentence_scores[i] = values[i];
            cand_beams[i] = at[i] / k;
            cand_tokens[i] = at[i] % k == 0 ? s_.eos : -1;
        }
    }

    // Store the hypotheses ending with EOS among each sentence's first
    // `beam` candidates, as fairseq does; the original indices of the
    // sentences now finished.
    std::vector<int64_t> finalize(int64_t step, int64_t bsz, int64_t width, const std::vector<uint8_t> &eos,
                                  const std::vector<int64_t> &cand_beams, const std::vector<float> &sentence_scores,
                                  const std::vector<int64_t> &sentences) {
        const int64_t beam = s_.beam;
        std::vector<int64_t> ended;  // sentences with a hypothesis ending here, in order
        const float divisor = s_.normalize_scores
                                  ? static_cast<float>(std::pow(static_cast<double>(step + 1), s_.len_penalty))
                                  : 1.0f;
        for (int64_t b = 0; b < bsz; ++b)
            for (int64_t j = 0; j < std::min(beam, width); ++j) {
                const int64_t at = b * width + j;
                if (!eos[at]) continue;
                const int64_t row = cand_beams[at] + b * beam;
                at::Tensor tokens = at::empty({step + 1}, at::kLong);
                at::Tensor positional = at::empty({step + 1}, at::kFloat);
                int64_t *t = tokens.data_ptr<int64_t>();
                float *c = positional.data_ptr<float>();
                t[step] = s_.eos;
                c[step] = sentence_scores[at];
                if (step > 0)
                    read_back(step_tokens_.data_ptr<int64_t>(), step_scores_.data_ptr<float>(),
                              step_parents_.data_ptr<int64_t>(), rows0_, &row, 1, step, t, c);
                const float score = s_.normalize_scores ? sentence_scores[at] / divisor : sentence_scores[at];
                std::vector<Hypothesis> &found = finalized_[sentences[b]];
                if (static_cast<int64_t>(found.size()) < beam) found.push_back({tokens, positional, score});
                if (ended.empty() || ended.back() != b) ended.push_back(b);
            }
        std::vector<int64_t> finished;
        for (int64_t b : ended) {
            const int64_t sentence = sentences[b];
            if (static_cast<int64_t>(finalized_[sentence].size()) == beam || step == s_.max_len)
                finished.push_back(sentence);
        }
        return finished;
    }

    DecoderLayers &decoder_;
    const Projection &projection_;
    const std::vector<int64_t> padded_;
    std::vector<std::unique_ptr<PackedCall>> calls_;
    Settings s_;
    at::Tensor embed_, positions_, padding_;
    float embed_scale_;
    int64_t bsz_, rows0_, capacity_, length_ = 0, candidates_;
    std::vector<fh_decoder_layer> layers_;
    std::vector<SourceCache> sources_;
    std::vector<at::Tensor> lineage_keys_, lineage_values_;
    at::Tensor generators_;  // sampling: each sentence's generator state
    at::Tensor ancestors_, moved_, step_tokens_, step_scores_, step_parents_, features_;
    at::Tensor top_values_, top_tokens_, normalisers_;
    std::vector<int64_t> special_columns_[2];
    std::vector<float> special_adds_[2];
    std::vector<std::vector<Hypothesis>> finalized_;
};

}  // namespace

void register_search(py::module_ &m) {
    py::class_<Projection>(m, "Projection", "how the native search's steps make their logits")
        .def(py::init<std::optional<at::Tensor>, std::shared_ptr<PackedLinear>, std::shared_ptr<Int8Linear>,
                      int64_t>(),
             py::kw_only(), py::arg("transposed"), py::arg("packed"), py::arg("int8"), py::arg("block"));
    m.def(
        "beam_search",
        [](DecoderLayers &decoder, const std::vector<std::tuple<LinearSpec, LinearSpec>> &source_weights,
           const at::Tensor &encoder_out, const std::optional<at::Tensor> &encoder_padding,
           const at::Tensor &embed_weight, double embed_scale, const std::optional<at::Tensor> &positions,
           const Projection &projection, std::vector<int64_t> padded_rows, int64_t beam, int64_t max_len, int64_t min_len, int64_t bos, int64_t eos,
           int64_t pad, int64_t pad_column, int64_t unk, int64_t vocab, double unk_penalty, double temperature,
           double len_penalty, bool normalize_scores, bool sampling, int64_t topk,
           const std::optional<at::Tensor> &generators) {
            require(beam >= 1 && vocab >= 2 && max_len >= min_len, "beam >= 1, a vocabulary, min_len <= max_len");
            require(topk >= 0, "topk >= 0");
            const Settings settings{beam,       max_len, min_len, bos,         eos,         pad,
                                    pad_column, unk,     vocab,   unk_penalty, temperature, len_penalty,
                                    normalize_scores, sampling, topk};
            std::vector<std::vector<Hypothesis>> found;
            {
                py::gil_scoped_release released;
                c10::NoGradGuard no_grad;
                BeamSearch search(decoder, source_weights, encoder_out, encoder_padding, embed_weight, embed_scale,
                                  positions, projection, std::move(padded_rows), settings, generators);
                found = search.run();
            }
            py::list sentences;
            for (const auto &hypotheses : found) {
                py::list each;
                for (const Hypothesis &h : hypotheses)
                    each.append(py::make_tuple(h.tokens, at::scalar_tensor(h.score, at::kFloat), h.positional_scores));
                sentences.append(each);
            }
            return sentences;
        },
        py::kw_only(), py::arg("decoder"), py::arg("source_weights"), py::arg("encoder_out"),
        py::arg("encoder_padding"), py::arg("embed_weight"), py::arg("embed_scale"), py::arg("positions"),
        py::arg("projection"), py::arg("padded_rows"), py::arg("beam"), py::arg("max_len"), py::arg("min_len"), py::arg("bos"),
        py::arg("eos"), py::arg("pad"), py::arg("pad_column"), py::arg("unk"), py::arg("vocab"),
        py::arg("unk_penalty"), py::arg("temperature"), py::arg("len_penalty"), py::arg("normalize_scores"),
        py::arg("sampling") = false, py::arg("topk") = 0, py::arg("generators") = std::nullopt);
}

}  // namespace fairseq_hardattn
