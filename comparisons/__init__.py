"""The papers' comparisons, beside the methods they are compared with: DelTA's baselines (SAPO, Forking Tokens, FIPO:
sapo.py, forking_tokens.py, fipo.py; their maths in baselines.py), DelTA's ablations and Q2 (delta_ablations.py,
q2.py), CSCR's ablations (cscr_ablations.py) and verl's Optimal Token Baseline (otb.py).

Run them with ``python -m comparisons``: grpo.py's flags and every comparison's own. Each comparison is one file that
declares its flags (``Flags``, a dataclass; ``MORE_CHOICES``: values it adds to one of grpo.py's flags, e.g.
``--credit otb``), their checks (``checks(cfg)``) and ``replace(cfg, method)``: grpo.py's ``Method`` with the whole
function its flags choose in place of the paper's (a credit function, a loss stage or the surrogate's settings), or
the method unchanged. ``method`` applies them in the order of ``COMPARISONS``, once, when a run starts; grpo.py,
delta.py, cscr.py and trainer/ name none of them. A new comparison is its file and its name in ``COMPARISONS``.

Imported by ``python -m comparisons`` (comparisons/__main__.py), tools/ and the tests; imports grpo (the functions
its comparisons replace or reuse), delta, cscr and trainer/, never tools/.
"""

from __future__ import annotations

import dataclasses
import importlib

# The comparisons, in the order their ``replace`` is applied (a credit first, then what wraps the loss)
PROG = "python -m comparisons"  # the command line's name in its help and errors
COMPARISONS = ("cscr_ablations", "delta_ablations", "q2", "otb", "fipo", "forking_tokens", "sapo")


def modules() -> list:
    """The comparisons' modules, in ``COMPARISONS``' order."""
    return [importlib.import_module(f"comparisons.{name}") for name in COMPARISONS]


def config_class():
    """grpo.py's ``GRPOConfig`` with every comparison's flags (their ``Flags``), the values they add to grpo.py's
    flags' choices (``MORE_CHOICES``, named in the flag's help) and their checks: the dataclass of
    ``python -m comparisons``' settings, saved whole in config.json and checked by --resume as grpo.py's are."""
    from trainer import grpo_config

    flags = tuple(module.Flags for module in modules() if hasattr(module, "Flags"))
    extended = []
    for name, values in more_choices().items():
        base = grpo_config.GRPOConfig.__dataclass_fields__[name]
        added = "; ".join(f"{value}: {meaning}" for value, meaning in values.items())
        field = grpo_config.flag(
            base.default, f"{base.metadata['help']}; {added}", [*base.metadata["choices"], *values]
        )
        extended.append((name, base.type, field))
    namespace = {"checks": _checks}
    return dataclasses.make_dataclass(
        "ComparisonConfig", extended, bases=(grpo_config.GRPOConfig, *flags), namespace=namespace
    )


def more_choices() -> dict[str, dict[str, str]]:
    """{grpo.py flag: {value a comparison adds: what it means}}, over every comparison."""
    out = {}
    for module in modules():
        for flag, values in getattr(module, "MORE_CHOICES", {}).items():
            out.setdefault(flag, {}).update(values)
    return out


def _checks(cfg) -> list[tuple[bool, str]]:  # ComparisonConfig.checks: every comparison's (grpo_config.check_config)
    return [check for module in modules() if hasattr(module, "checks") for check in module.checks(cfg)]


def method(cfg):
    """The run's ``grpo.Method``: the paper's of the flags (a --credit only a comparison knows: none yet), then each
    comparison's ``replace`` in ``COMPARISONS``' order. Two comparisons that each replace the loss stage, or each the
    surrogate, cannot run together: one line naming both. Raises ValueError for a --credit no one knows."""
    import grpo

    chosen = grpo.Method(grpo.CREDIT_FUNCTIONS.get(cfg.credit), grpo.LossStage(), grpo.LossSettings, cfg.credit)
    replaced = {}  # the part of the method -> the comparison that replaced it
    for name, module in zip(COMPARISONS, modules()):
        new = module.replace(cfg, chosen)
        for part in ("loss_stage", "loss_settings"):
            if getattr(new, part) is not getattr(chosen, part):
                if part in replaced:
                    raise SystemExit(
                        f"comparisons: error: {replaced[part]} and {name} each replace the {part}: give one"
                    )
                replaced[part] = name
        chosen = new
    if chosen.credit is None:
        raise ValueError(f"--credit {cfg.credit!r}: no credit function of that name")
    return chosen


def main(argv=None) -> None:
    """``python -m comparisons``: grpo.py's command with the comparisons' flags."""
    import grpo
    from trainer import grpo_config, run_setup

    config = config_class()
    about = "grpo.py's trainer with the papers' comparisons (comparisons/): grpo.py's flags and theirs."
    cfg = config(**vars(grpo_config.build_parser(config, description=about, prog=PROG).parse_args(argv)))
    given = set(vars(grpo_config.build_parser(config, defaults=False, prog=PROG).parse_args(argv)))  # beat the recipe's
    run_setup.run_command(grpo.train, cfg, given, method(cfg))
