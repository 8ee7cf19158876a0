"""Flexible attention (Shu & Nakayama 2017) and its fine-tuning criterion:
the fine-tunings beside their controls, the decodes at each threshold τ that
count score computations, and the rows of the paper's Table 1."""

from .manifest import CONVERSION_SCHEDULE, Decode, FineTune

GATE_LOSS = "--criterion label_smoothed_cross_entropy_with_gate --gate-beta 0.1"

FINETUNES = (
    FineTune("flexible_ft", "flexible", "transformer_flexible_small", GATE_LOSS,
             "flexible, fine-tuned 1 epoch with CE − 0.1·mean(g)"),
    # where decoding will look: attending only within the bands of τ (the paper's rule)
    FineTune("flexible_band_ft", "flexible", "transformer_flexible_small",
             GATE_LOSS + " --flexible-train-threshold",
             "flexible, fine-tuned as flexible_ft, attending only within the bands of τ = log₁₀ S̄"),
    FineTune("flexible_gate32_band_ft", "flexible_gate32", "transformer_flexible_small",
             "--flexible-gate-dim 32 " + GATE_LOSS + " --flexible-train-threshold",
             "flexible_gate32, fine-tuned as flexible_band_ft"),
    # the control of the fine-tunings' gain: the same epoch, plain loss
    FineTune("soft_ft", "soft", "transformer_soft_small", "",
             "soft, 1 more epoch as flexible_ft's (the control of its gain)"),
    # the same control on flexible itself: what the gate loss adds to the epoch
    FineTune("flexible_ce_ft", "flexible", "transformer_flexible_small", "",
             "flexible, 1 more epoch as flexible_ft's with the plain loss (the control of the gate loss)"),
    # the band fine-tuning with the conversions' schedule: 5 epochs, 2 averaged
    FineTune("flexible_band_5ep_ft", "flexible", "transformer_flexible_small",
             GATE_LOSS + " --flexible-train-threshold",
             "flexible_band_ft for 5 epochs (warmup 100, the last 2 averaged)",
             **CONVERSION_SCHEDULE),
)

_FLEXIBLE = ("flexible", "flexible_ft", "flexible_band_ft", "flexible_gate32", "flexible_gate32_band_ft",
             "flexible_ce_ft", "flexible_band_5ep_ft")
DECODES = (
    *(Decode(f"{run}_inf", run, {"flexible_threshold": "inf"}, cps=True) for run in _FLEXIBLE),
    *(Decode(f"{run}_auto", run, cps=True) for run in _FLEXIBLE),
    *(Decode(f"{run}_tau075", run, {"flexible_threshold": 0.75}, cps=True)
      for run in _FLEXIBLE if run.endswith("_ft")),
    Decode("local_cps", "local", cps=True),
)

CPS_ROWS = (  # the flexible-attention paper's Table 1: (result name, what)
    ("soft", "global attention (soft baseline)"),
    ("local_cps", "local attention (Luong local-p, D=10)"),
    ("flexible_inf", "flexible attention, τ = ∞ (no skipping)"),
    ("flexible_auto", "flexible attention, τ = log₁₀ S̄ (the paper's rule)"),
    ("flexible_ce_ft_inf", "+ 1 epoch with the plain loss (the gate loss's control), τ = ∞"),
    ("flexible_ce_ft_auto", "+ 1 epoch with the plain loss, τ = log₁₀ S̄"),
    ("flexible_ft_inf", "+ fine-tuning with the gate loss, τ = ∞"),
    ("flexible_ft_auto", "+ fine-tuning with the gate loss, τ = log₁₀ S̄"),
    ("flexible_ft_tau075", "+ fine-tuning with the gate loss, τ = 0.75"),
    ("flexible_band_ft_inf", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = ∞"),
    ("flexible_band_ft_auto", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = log₁₀ S̄"),
    ("flexible_band_ft_tau075", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = 0.75"),
    ("flexible_band_5ep_ft_inf", "+ the same fine-tuning for 5 epochs (2 averaged), τ = ∞"),
    ("flexible_band_5ep_ft_auto", "+ the same fine-tuning for 5 epochs, τ = log₁₀ S̄"),
    ("flexible_band_5ep_ft_tau075", "+ the same fine-tuning for 5 epochs, τ = 0.75"),
    ("flexible_gate32_inf", "flexible attention with a 32-unit gate network (d/4), τ = ∞"),
    ("flexible_gate32_auto", "flexible attention with a 32-unit gate network, τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft_inf", "+ fine-tuning within the bands, decoded with τ = ∞"),
    ("flexible_gate32_band_ft_auto", "+ fine-tuning within the bands, decoded with τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft_tau075", "+ fine-tuning within the bands, decoded with τ = 0.75"),
    ("soft_ft", "global attention, 1 more epoch as the fine-tuning's (its control)"),
)
