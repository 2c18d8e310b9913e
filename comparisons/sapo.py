"""SAPO (docs/specs/baselines.md §4): a soft gate in place of the clip, as a policy loss (``--loss_type sapo``) with its
own settings, built from the flags of the same names (``SapoSettings.from_config``); the gate is baselines.py's."""

from __future__ import annotations

from dataclasses import dataclass

import grpo
from comparisons import baselines


@dataclass(frozen=True)
class SapoSettings(grpo.LossSettings):
    """grpo.LossSettings and SAPO's own: τ_pos, τ_neg (--sapo_temperature_pos/neg) and the normaliser
    (--sapo_aggregation: ``sequence``, grpo's seq-mean-token-mean, verl forces it and TRL uses it; ``token``:
    dapo's token-mean), which sets ``aggregation``."""

    loss_type: str = "sapo"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    sapo_aggregation: str = "sequence"

    def __post_init__(self):
        object.__setattr__(self, "aggregation", "grpo" if self.sapo_aggregation == "sequence" else "dapo")


def register(credit_functions: dict, loss_stages: dict, policy_losses: dict) -> None:
    policy_losses["sapo"] = grpo.PolicyLoss(baselines.sapo_surrogate, "grpo", SapoSettings)
