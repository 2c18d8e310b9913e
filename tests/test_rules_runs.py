"""A short toy run with every comparison rule's flag value completes and logs its rule's statistics
(docs/reproduce.md's rows; about half a minute)."""

import json

import pytest

import comparisons
from trainer import grpo_config

RULES = {  # flags -> a metrics.jsonl key the rule logs (None: the rule's own keys are the loss's)
    "sapo": (["--loss_type", "sapo"], None),
    "sapo_token": (["--loss_type", "sapo", "--sapo_aggregation", "token"], None),
    "forking_tokens": (["--entropy_top_ratio", "0.2"], "forking/kept_frac"),
    "forking_tokens_trl": (["--top_entropy_quantile", "0.2"], "forking/kept_frac"),
    "forking_tokens_micro": (["--entropy_top_ratio", "0.2", "--entropy_pool", "micro"], "forking/kept_frac"),
    "fipo": (["--credit", "fipo", "--dual_clip", "10"], "fipo/f_mean"),
    "delta_within_side": (["--credit", "delta", "--delta_scores", "within_side"], "delta/gamma_pos"),
    "delta_hard": (["--credit", "delta", "--delta_assignment", "hard"], "delta/lam_pos_mean"),
    "delta_frozen_gamma": (["--credit", "delta", "--delta_gamma", "frozen"], "delta/gamma_pos"),
    "delta_raw_alpha": (["--credit", "delta", "--delta_coefficients", "raw"], "delta/lam_pos_mean"),
    "delta_random": (["--credit", "delta", "--delta_coefficients", "random"], None),
    "delta_no_lamnorm": (["--credit", "delta", "--no-delta_normalize"], "delta/scale"),
    "delta_topk": (["--credit", "delta", "--delta_proxy", "topk", "--delta_proxy_topk", "4"], "delta/cos_mu"),
    "delta_topk_streamed": (
        ["--credit", "delta", "--delta_proxy", "topk", "--delta_impl", "memory_efficient"],
        "delta/cos_mu",
    ),
    "delta_select_top": (["--credit", "delta", "--delta_select", "top"], "delta/selected_frac"),
    "cscr_sign_aware": (["--credit", "cscr", "--cscr_weight", "sign_aware"], "cscr/w_mean"),
    "cscr_upweight": (["--credit", "cscr", "--cscr_weight", "upweight"], "cscr/w_mean"),
    "cscr_group": (["--credit", "cscr", "--cscr_scope", "group"], "cscr/w_mean"),
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_runs_on_the_toy(toy_model_path, tmp_path, name):
    flags, key = RULES[name]
    out = tmp_path / name
    comparisons.main(
        [
            "--model",
            toy_model_path,
            "--max_steps",
            "2",
            "--num_prompts_per_step",
            "4",
            "--num_generations",
            "4",
            "--num_mini_batches",
            "2",
            "--eval_num_generations",
            "0",
            "--save_steps",
            "0",
            "--output_dir",
            str(out),
            *flags,
        ]
    )
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["skipped_updates"] == 0 for line in lines)
    if key is not None:
        assert all(key in line for line in lines), sorted(lines[0])
    samples = [
        json.loads(line) for f in sorted((out / "samples").glob("step_*.jsonl")) for line in f.read_text().splitlines()
    ]
    assert samples and all(len(s["credit"]) == len(s["tokens"]) for s in samples)


def test_help_lists_every_rule_flag(capsys):
    """``python -m comparisons --help`` names every comparison's flag and choice; grpo.py's help names none of them."""
    import comparisons

    with pytest.raises(SystemExit):
        grpo_config.build_parser().parse_args(["--help"])
    papers = capsys.readouterr().out
    assert "--entropy_top_ratio" not in papers and "--delta_select" not in papers and "sapo" not in papers
    with pytest.raises(SystemExit):
        grpo_config.build_parser(comparisons.config_class()).parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in (
        "--loss_type",
        "sapo",
        "--sapo_temperature_pos",
        "--entropy_top_ratio",
        "--top_entropy_quantile",
        "--entropy_pool",
        "--fipo",
        "--delta_scores",
        "--delta_assignment",
        "--delta_gamma",
        "--delta_coefficients",
        "--delta_normalize",
        "--delta_proxy",
        "--delta_proxy_topk",
        "--delta_select",
        "--cscr_weight",
        "--cscr_scope",
    ):
        assert flag in text


def test_help_reads_in_groups_with_a_short_usage_and_whole_defaults(capsys):
    """``--help`` (issue #53): a usage line of its own (not every flag), the flags in groups as TRL's and verl's
    configs group them, a comparison's flags under its file (python -m comparisons), each default printed whole (a
    list of module names is not broken mid-word), and the recipes' GPU additions in the epilog."""
    import comparisons

    with pytest.raises(SystemExit):
        grpo_config.build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "usage: python grpo.py [--flag value ...]  (the flags below, by group)"
    for title in grpo_config.HELP_GROUPS.values():
        assert f"\n{title}:\n" in text, title
    assert "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)" in text.replace("\n", " ").replace("  ", "")
    assert "and on GPUs --use_vllm" in " ".join(text.split())
    with pytest.raises(SystemExit):
        grpo_config.build_parser(comparisons.config_class(), prog=comparisons.PROG).parse_args(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m comparisons [--flag value ...]")
    assert "\ncomparisons/fipo.py:\n" in text and "\ncomparisons/delta_ablations.py:\n" in text


@pytest.mark.parametrize("value", ["-1e-4", "-1E-4", "-.5", "-1.5e+2", "-2"])
def test_a_negative_number_in_any_form_is_a_flags_value(value):
    """``--learning_rate -1e-4`` is the value -1e-4 (argparse alone reads a negative number in exponent form as a
    flag: "expected one argument"), then checked by the project's own rules like any value."""
    parsed = grpo_config.build_parser().parse_args(["--learning_rate", value, "--seed", "-3"])
    assert parsed.learning_rate == float(value) and parsed.seed == -3
    with pytest.raises(SystemExit, match="--learning_rate"):
        grpo_config.check_config(grpo_config.GRPOConfig(learning_rate=float(value)))
