"""Smoke test of bench/scaling.py (the benchmark-only patches and the summary), on a tiny grid.

Checks what the benchmark's numbers rely on, not timings: every response really has the forced length, the random
rewards give every response a non-zero advantage (so DelTA's and CSCR's hooks run on every row), the runs of one
cell see identical rollouts, and the summary's ratios are computed against the same cell's GRPO row.
No trl needed.
"""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import scaling  # noqa: E402


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling") / "scaling.json"
    res = scaling.main(["--cells", "toy:12", "--credits", "grpo,delta,cscr", "--steps", "2",
                        "--num_prompts_per_step", "2", "--num_generations", "2", "--out", str(out)])
    return res, out


def test_forced_length_and_random_rewards(result):
    res, _ = result
    assert res["all_responses_full_length"] is True
    for run in res["runs"]:
        for step in run["steps"]:
            assert step["completions/mean_length"] == 12.0
            assert step["response_width"] == 12 and step["response_tokens"] == 2 * 2 * 12
            assert step["reward"] == 0.5  # exactly half of each group marked correct
            assert step["rows_nonzero_adv"] == 4  # every response has a non-zero advantage
            assert step["frac_reward_zero_std"] == 0.0


def test_credit_hooks_run_and_ratios(result):
    res, out = result
    rows = {r["credit"]: r for r in res["summary"]}
    assert set(rows) == {"grpo", "delta", "cscr"}
    assert rows["grpo"]["ratio_s_per_step"] == pytest.approx(1.0)
    for name in ("delta", "cscr"):
        assert rows[name]["ratio_s_per_step"] == pytest.approx(rows[name]["s_per_step"] / rows["grpo"]["s_per_step"])
    assert all(r["steps_timed"] == 1 and r["torch_threads"] == [1] for r in rows.values())
    assert res["models"]["toy"]["num_parameters"] == 813_440
    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "scaling" and saved["machine"]["versions"]["torch"]
    assert saved["table_markdown"].count("\n| toy") == 3


def test_bad_cells_rejected():
    with pytest.raises(SystemExit, match="bad --cells entry"):
        scaling.parse_cells("toy:0")
    with pytest.raises(SystemExit, match="bad --cells entry"):
        scaling.parse_cells("giant:64")
    assert scaling.parse_cells("toy:64, 30m:256,toy:64") == [("toy", 64), ("30m", 256)]
