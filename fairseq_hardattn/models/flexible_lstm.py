"""``lstm_flexible``: fairseq's LSTM encoder-decoder with flexible attention,
the setting of Shu & Nakayama (2017), whose model is an RNN.

fairseq's LSTM decoder runs its attention step by step, in training too, so
the tracked centre p_{t-1} is always the real previous step's (no estimate).
Options: those of flexible attention (``--flexible-sigma``,
``--flexible-threshold``, ``--flexible-mean-source-length``,
``--flexible-gate-dim``, ``--print-cps``),
and fairseq's LSTM options (``--decoder-attention`` must stay on).
"""

from fairseq.models import lstm, register_model, register_model_architecture
from fairseq.models.lstm import LSTMDecoder, LSTMModel

from ..errors import ClearCheckpointErrors, ConfigError, check_joined_dictionary, data_dir
from ..compat.checkpoints import plain_args
from ..modules import FlexibleLSTMAttention
from .attention_kind_base import set_defaults
from .flexible_options import FlexibleAttentionOptions

MODEL_NAME = "flexible_lstm"
_CENTRE_STATE = "flexible_centre"


class FlexibleLSTMDecoder(LSTMDecoder):
    """fairseq's LSTM decoder with flexible attention. ``LSTMModel.build_model``
    constructs fairseq's ``LSTMDecoder`` by name, with no hook for another
    class: ``adopt`` takes the decoder it built and gives it this class and
    flexible attention in place of its attention layer."""

    @classmethod
    def adopt(cls, decoder: LSTMDecoder, **flexible_options):
        if decoder.attention is None:
            raise ConfigError("lstm_flexible needs attention: drop --decoder-attention False")
        decoder.__class__ = cls
        decoder.attention = FlexibleLSTMAttention(
            decoder.hidden_size, decoder.encoder_output_units, decoder.hidden_size, bias=False,
            **flexible_options)
        return decoder

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None):
        state = None
        if incremental_state is not None:
            state = self.get_incremental_state(incremental_state, _CENTRE_STATE)
        self.attention.start(state["centre"] if state else None)
        try:
            return super().extract_features(prev_output_tokens, encoder_out, incremental_state)
        finally:
            self.attention.finish()
            if incremental_state is not None and self.attention.centre is not None:
                self.set_incremental_state(incremental_state, _CENTRE_STATE,
                                           {"centre": self.attention.centre})

    def make_generation_fast_(self, need_attn=False, **kwargs):
        """Keep returning each step's attention, which the LSTM computes anyway:
        alignments (``--print-alignment``, the hub's ``print_alignment``) come
        from it, also when only the call asks for them."""
        super().make_generation_fast_(need_attn=True, **kwargs)

    def reorder_incremental_state(self, incremental_state, new_order):
        super().reorder_incremental_state(incremental_state, new_order)
        state = self.get_incremental_state(incremental_state, _CENTRE_STATE)
        if state:
            self.set_incremental_state(incremental_state, _CENTRE_STATE,
                                       {"centre": state["centre"].index_select(0, new_order)})


@register_model(MODEL_NAME)
class FlexibleLSTMModel(ClearCheckpointErrors, FlexibleAttentionOptions, LSTMModel):
    @staticmethod
    def add_args(parser):
        LSTMModel.add_args(parser)
        FlexibleAttentionOptions.add_flexible_args(parser)

    @classmethod
    def build_model(cls, args, task):
        flexible_lstm_defaults(args)
        threshold = cls.prepare_flexible_build(args, task)
        check_joined_dictionary(args, task)
        plain_args(args)
        model = super().build_model(args, task)
        FlexibleLSTMDecoder.adopt(model.decoder, sigma=args.flexible_sigma,
                                  gate_dim=args.flexible_gate_dim)
        model.data_dir = data_dir(task)
        model.finish_flexible_build(args, threshold)
        return model


def flexible_lstm_defaults(args):
    set_defaults(args, flexible_sigma=3.0, flexible_threshold="auto", flexible_gate_dim=None,
                 print_cps=False)


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def flexible_lstm_base_architecture(args):
    flexible_lstm_defaults(args)
    lstm.base_architecture(args)


@register_model_architecture(MODEL_NAME, "lstm_flexible")
def lstm_flexible(args):
    """fairseq's LSTM (512 units, one layer each side) with flexible attention."""
    flexible_lstm_base_architecture(args)
