"""Cross+self attention Transformers (Peitz, Garg et al. 2019).

Decoder self-attention and cross-attention become one attention over
[encoder states; decoder states] (``fairseq_hardattn.modules.CrossSelfAttention``):

- ``--cross-self-source final``: every decoder layer uses the final encoder
  output (``transformer_cross_self``);
- ``--cross-self-source layerwise``: decoder layer i uses encoder layer i's
  output (``transformer_cross_self_layerwise``; needs equal depths);
- ``--enc-dec-sharing``: encoder layer i and decoder layer i share their
  attention projections (``attention``), + the feed-forward (``attention+ffn``),
  + the layer norms (``attention+ffn+norm``): the paper's ablation rows;
- ``--dec-self-attn-kind hard`` gives hard retrieval cross+self attention
  (``transformer_hard_cross_self``).

fairseq's own ``--cross-self-attention --no-cross-attention`` is the "final"
variant with soft attention; this one decodes with the encoder part of the
keys/values kept once per sentence (see the module's docstring).
"""

from fairseq.models import register_model, register_model_architecture

from ..errors import ConfigError
from ..modules import CROSS_SELF_KINDS
from .attention_kind_base import (
    REPLACED,
    AttentionKindDecoder,
    AttentionKindDecoderLayer,
    AttentionKindEncoder,
    AttentionKindTransformerModel,
    base_architecture,
    big_architecture,
    hard_in,
    model_name,
    set_defaults,
    small_architecture,
)

MODEL_NAME = "cross_self_transformer"
SOURCES = ("final", "layerwise")
# cumulative, as the paper's rows: each level shares what the previous does and more
SHARING_LEVELS = ("none", "attention", "attention+ffn", "attention+ffn+norm")


class CrossSelfDecoderLayer(AttentionKindDecoderLayer):
    # fairseq's layer builds its self-attention with self_attention=False when
    # cfg.cross_self_attention is set, and feeds it [encoder; decoder] states
    self_attention_kinds = CROSS_SELF_KINDS

    def forward(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                *args, need_attn=False, need_head_weights=False, **kwargs):
        """fairseq's layer, returning the cross+self attention's weights over
        the source (its only attention over the source) as the layer's
        alignment, in evaluation passes over whole sequences."""
        asked = (need_attn or need_head_weights) and incremental_state is None and not self.training
        self.self_attn.alignment_request = need_head_weights if asked else None
        try:
            return super().forward(x, encoder_out, encoder_padding_mask, incremental_state, *args,
                                   need_attn=need_attn, need_head_weights=need_head_weights,
                                   **kwargs)
        finally:
            self.self_attn.alignment_request = None


class LayerwiseCrossSelfDecoderLayer(CrossSelfDecoderLayer):
    """Attends to the encoder layer of its own depth, which the decoder hands
    it as ``source_states`` for the duration of one forward call."""

    source_states = None

    def forward(self, x, encoder_out=None, *args, **kwargs):
        if self.source_states is not None:
            encoder_out = self.source_states
        return super().forward(x, encoder_out, *args, **kwargs)


class CrossSelfDecoder(AttentionKindDecoder):
    layer_class = CrossSelfDecoderLayer


class LayerwiseCrossSelfDecoder(AttentionKindDecoder):
    layer_class = LayerwiseCrossSelfDecoderLayer

    def encoder_states_per_layer(self, encoder_out):
        states = encoder_out["encoder_states"] if encoder_out is not None else []
        if encoder_out is not None and len(states) != len(self.layers) + 1:
            raise RuntimeError(
                f"layer-wise cross+self needs the encoder's per-layer states "
                f"({len(self.layers) + 1}), got {len(states)}"
            )
        return states[1:] if states else [None] * len(self.layers)  # states[0]: embeddings

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         **kwargs):
        try:
            for layer, state in zip(self.layers, self.encoder_states_per_layer(encoder_out)):
                layer.source_states = state
            return super().extract_features(
                prev_output_tokens, encoder_out, incremental_state, **kwargs
            )
        finally:
            for layer in self.layers:
                layer.source_states = None


class AllStatesEncoder(AttentionKindEncoder):
    """Always returns every layer's output (fairseq returns them only when asked,
    and its generator does not ask)."""

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens=False,
                token_embeddings=None):
        return super().forward(src_tokens, src_lengths, return_all_hiddens=True,
                               token_embeddings=token_embeddings)


def share_layers(encoder, decoder, level):
    """Make decoder layer i use encoder layer i's modules, up to ``level``."""
    shared = SHARING_LEVELS.index(level)
    for enc_layer, dec_layer in zip(encoder.layers, decoder.layers):
        if shared >= 1:
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                setattr(dec_layer.self_attn, proj, getattr(enc_layer.self_attn, proj))
        if shared >= 2:
            dec_layer.fc1, dec_layer.fc2 = enc_layer.fc1, enc_layer.fc2
        if shared >= 3:
            dec_layer.self_attn_layer_norm = enc_layer.self_attn_layer_norm
            dec_layer.final_layer_norm = enc_layer.final_layer_norm


@register_model(MODEL_NAME)
class CrossSelfTransformerModel(AttentionKindTransformerModel):
    decoder_class = CrossSelfDecoder
    replaced_sublayers = {
        "dec_cross_attn_kind": "cross+self attention has no separate cross-attention "
                               "(set the cross+self kind with --dec-self-attn-kind)"
    }

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--cross-self-source", choices=SOURCES,
                            help="encoder states each decoder layer attends to: the final "
                                 "encoder output, or encoder layer i's for decoder layer i")
        parser.add_argument("--enc-dec-sharing", choices=SHARING_LEVELS,
                            help="modules encoder layer i shares with decoder layer i")

    @classmethod
    def validate_args(cls, args):
        super().validate_args(args)
        if not (args.cross_self_attention and args.no_cross_attention):
            raise ConfigError(f"{model_name(args)} needs --cross-self-attention "
                              "and --no-cross-attention (its presets set both)")
        if args.cross_self_source not in SOURCES:
            raise ConfigError(f"--cross-self-source must be one of {SOURCES}")
        if args.enc_dec_sharing not in SHARING_LEVELS:
            raise ConfigError(f"--enc-dec-sharing must be one of {SHARING_LEVELS}")
        if args.encoder_embed_dim != args.decoder_embed_dim:
            raise ConfigError(
                "cross+self attention projects encoder and decoder states with the same "
                f"weights: --encoder-embed-dim ({args.encoder_embed_dim}) must equal "
                f"--decoder-embed-dim ({args.decoder_embed_dim})"
            )
        per_layer = args.cross_self_source == "layerwise" or args.enc_dec_sharing != "none"
        if per_layer and args.encoder_layers != args.decoder_layers:
            what = ("--cross-self-source layerwise" if args.cross_self_source == "layerwise"
                    else f"--enc-dec-sharing {args.enc_dec_sharing}")
            raise ConfigError(
                f"{what} pairs encoder layer i with decoder layer i: --encoder-layers "
                f"({args.encoder_layers}) must equal --decoder-layers ({args.decoder_layers})"
            )
        if args.enc_dec_sharing != "none":
            for name in ("attention_heads", "ffn_embed_dim"):
                enc, dec = getattr(args, "encoder_" + name), getattr(args, "decoder_" + name)
                if enc != dec:
                    raise ConfigError(f"--enc-dec-sharing needs --encoder-{name.replace('_', '-')} "
                                      f"({enc}) == --decoder-{name.replace('_', '-')} ({dec})")
            if args.checkpoint_activations:
                raise ConfigError("--enc-dec-sharing does not work with --checkpoint-activations")

    @classmethod
    def encoder_decoder_classes(cls, args):
        if args.cross_self_source == "layerwise":
            return AllStatesEncoder, LayerwiseCrossSelfDecoder
        return AttentionKindEncoder, CrossSelfDecoder

    @classmethod
    def build_model(cls, args, task):
        cross_self_base(args)
        model = super().build_model(args, task)
        if args.enc_dec_sharing != "none":
            share_layers(model.encoder, model.decoder, args.enc_dec_sharing)
        return model


# --- architectures ------------------------------------------------------------


def cross_self_base(args):
    set_defaults(args, cross_self_attention=True, no_cross_attention=True,
                 cross_self_source="final", enc_dec_sharing="none",
                 dec_cross_attn_kind=REPLACED)


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def cross_self_base_architecture(args):
    cross_self_base(args)
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_cross_self")
def transformer_cross_self(args):
    """Final encoder output in every decoder layer (the paper's better variant)."""
    cross_self_base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_cross_self_big")
def transformer_cross_self_big(args):
    cross_self_base(args)
    big_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_cross_self_small")
def transformer_cross_self_small(args):
    cross_self_base(args)
    small_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_cross_self_layerwise")
def transformer_cross_self_layerwise(args):
    set_defaults(args, cross_self_source="layerwise")
    transformer_cross_self(args)


@register_model_architecture(MODEL_NAME, "transformer_cross_self_layerwise_big")
def transformer_cross_self_layerwise_big(args):
    set_defaults(args, cross_self_source="layerwise")
    transformer_cross_self_big(args)


@register_model_architecture(MODEL_NAME, "transformer_cross_self_layerwise_small")
def transformer_cross_self_layerwise_small(args):
    set_defaults(args, cross_self_source="layerwise")
    transformer_cross_self_small(args)


@register_model_architecture(MODEL_NAME, "transformer_hard_cross_self")
def transformer_hard_cross_self(args):
    """Hard retrieval cross+self attention: one [encoder; decoder] key per head."""
    hard_in(args, "dec_self")
    transformer_cross_self(args)


@register_model_architecture(MODEL_NAME, "transformer_hard_cross_self_big")
def transformer_hard_cross_self_big(args):
    hard_in(args, "dec_self")
    transformer_cross_self_big(args)


@register_model_architecture(MODEL_NAME, "transformer_hard_cross_self_small")
def transformer_hard_cross_self_small(args):
    hard_in(args, "dec_self")
    transformer_cross_self_small(args)
