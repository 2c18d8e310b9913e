"""SAPO (docs/specs/baselines.md §4): a soft gate in place of the clip, as the surrogate's settings
(``--loss_type sapo``, ``python -m comparisons``) with its own flags (``Flags``); the gate is baselines.py's."""

from __future__ import annotations

from dataclasses import dataclass

import grpo
from comparisons import baselines
from trainer.grpo_config import flag

MORE_CHOICES = {"loss_type": {"sapo": "SAPO's soft gate in place of the clip (comparisons/sapo.py)"}}


@dataclass
class Flags:
    sapo_temperature_pos: float = flag(1.0, "SAPO's gate temperature τ for Â > 0")
    sapo_temperature_neg: float = flag(1.05, "SAPO's gate temperature τ for Â < 0")
    sapo_aggregation: str = flag(
        "sequence", "SAPO: per-sequence mean then mean (verl, TRL) or token-mean", ["sequence", "token"]
    )


def checks(cfg) -> list[tuple[bool, str]]:
    return [
        (
            min(cfg.sapo_temperature_pos, cfg.sapo_temperature_neg) <= 0,
            "--sapo_temperature_pos and --sapo_temperature_neg must be > 0",
        )
    ]


@dataclass(frozen=True)
class SapoSettings(grpo.LossSettings):
    """grpo.LossSettings with SAPO's gate as the surrogate and its own fields: τ_pos, τ_neg (--sapo_temperature_pos/neg)
    and the normaliser (--sapo_aggregation: ``sequence``, seq-mean-token-mean, as verl forces and TRL uses; ``token``:
    token-mean)."""

    loss_type: str = "sapo"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    sapo_aggregation: str = "sequence"
    surrogate = staticmethod(baselines.sapo_surrogate)

    @property
    def aggregation(self) -> str:
        return "seq-mean-token-mean" if self.sapo_aggregation == "sequence" else "token-mean"


def replace(cfg, method: grpo.Method) -> grpo.Method:
    """``method`` with SAPO's surrogate under --loss_type sapo."""
    if cfg.loss_type != "sapo":
        return method
    label = "sapo" if method.label == "grpo" else f"sapo+{method.label}"
    return method._replace(loss_settings=SapoSettings, label=label)
