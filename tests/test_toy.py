"""The shipped toy base model (toy/model/) is the one today's recipe builds, toy.py decides once which folder
``--model toy`` loads, and tools/bench/toy_rebuild.py (.ci/run's rebuild check) can tell a rebuild from the shipped
model;
the truth of a toy response (its first wrong token, shared prefix, result digits) on hand-made responses."""

import json
import shutil
from pathlib import Path

import pytest
import torch

import toy
from tools.bench import toy_rebuild


def test_shipped_toy_model_is_todays_recipe():
    assert toy.ensure_toy_model() == str(toy.SHIPPED) and toy.SHIPPED == Path(toy.__file__).resolve().parent / "model"
    info = json.loads((toy.SHIPPED / "toy_info.json").read_text())
    assert info == {
        "version": toy.TOY_VERSION,
        "warmup_steps": toy.WARMUP["steps"],
        "seed": 0,
        "warmup": toy.WARMUP,
        "model": toy.MODEL,
    }
    assert sum(f.stat().st_size for f in toy.SHIPPED.iterdir()) < 5e6  # a few MB in the repository


def test_compare_weights_tells_identical_from_different(tmp_path):
    same_a, same_b = (toy.build_toy_model(tmp_path / name, warmup_steps=0, seed=0) for name in ("a", "b"))
    other = toy.build_toy_model(tmp_path / "c", warmup_steps=0, seed=1)
    assert toy.compare_weights(same_a, same_b) == {"identical": True, "max_abs_weight_diff": 0.0}
    res = toy.compare_weights(other, same_a)
    assert not res["identical"] and res["max_abs_weight_diff"] > 0
    # different weights: both models evaluated (here on 2 held-out problems), ok within the tolerance
    res = toy_rebuild.compare_models(other, same_a, rows=toy.make_split("test", n=2))
    assert set(res["rebuilt"]) == set(res["shipped"]) == {"greedy", "avg@8"}
    assert res["ok"] == all(
        abs(res["rebuilt"][k] - res["shipped"][k]) <= toy_rebuild.REBUILD_TOLERANCE for k in ("greedy", "avg@8")
    )
    (tmp_path / "d").mkdir()
    from safetensors.torch import save_file

    save_file({"other.weight": torch.zeros(1)}, tmp_path / "d" / "model.safetensors")
    with pytest.raises(ValueError, match="hold different tensors"):
        toy.compare_weights(tmp_path / "d", same_a)


def test_rebuild_check_passes_when_the_recipe_makes_the_shipped_model(tmp_path, monkeypatch, capsys):
    # the 7-minute warm-up replaced by a copy of the shipped folder: the script's path from build to verdict
    monkeypatch.setattr(toy, "build_toy_model", lambda path: shutil.copytree(toy.SHIPPED, path))
    assert toy_rebuild.main(["--output", str(tmp_path)]) == 0
    assert "identical weights to the shipped toy/model/" in capsys.readouterr().out
    assert (tmp_path / "model" / "model.safetensors").exists()
    monkeypatch.setattr(toy, "SHIPPED", tmp_path / "missing")
    with pytest.raises(SystemExit, match="no shipped model to compare with"):
        toy_rebuild.main([])


def test_a_clone_without_the_shipped_model_builds_it_once(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(toy, "SHIPPED", tmp_path / "missing")
    monkeypatch.setenv("RLVR_TOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        toy,
        "build_toy_model",
        lambda path: (
            built.append(path) or Path(path).mkdir(parents=True) or (Path(path) / "config.json").write_text("{}")
        ),
    )
    assert toy.model_folder() == toy.cache_dir()  # the folder, named before anything is built
    first = toy.ensure_toy_model()
    assert first == str(toy.cache_dir()) and first.startswith(str(tmp_path / "cache")) and len(built) == 1
    assert toy.ensure_toy_model() == first and len(built) == 1  # cached: built once
    assert toy.cache_dir(tmp_path / "other") == tmp_path / "other" / f"toy-{toy.TOY_VERSION}"


def test_python_toy_py_prints_the_folder_and_writes_the_splits(tmp_path, capsys):
    assert toy.main([]) == 0 and capsys.readouterr().out.strip() == str(toy.SHIPPED) == str(toy.model_folder())
    assert toy.main(["--write_data", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "toy_test.jsonl").read_text().splitlines()]
    assert rows == toy.make_split("test")


# --------------------------------------------------------------------------------------------- the truth of a response
P = "Compute 37+48-12."  # 37+48=85, 85-12=73
EOS = "</s>"


def _toks(text, eos=True):
    """A response's tokens as samples/ logs them for the character-level toy tokenizer."""
    return list(text) + [EOS] * eos


def test_correct_solutions_follow_the_grammar():
    assert toy.parse_problem("Compute 37+48-12.\n") == (37, [("+", 48), ("-", 12)])
    assert toy.correct_solutions(P) == [
        "\\boxed{73}",
        "37+48=85. \\boxed{73}",
        "37+48=85. 85-12=73. \\boxed{73}",
        "37+48-12=73. \\boxed{73}",
    ]
    assert toy.correct_solutions("<prompt> Compute 6-4.") == ["\\boxed{2}", "6-4=2. \\boxed{2}"]
    # what the warm-up writes without mistakes is among them
    chain = [(37, "+", 48, 85), (85, "-", 12, 73)]
    assert toy.worked_solution(chain) in toy.correct_solutions(P)
    with pytest.raises(ValueError, match="not a toy problem"):
        toy.parse_problem("What is 2+2?")


@pytest.mark.parametrize(
    "text, eos, expected",
    [
        # correct solutions and prefixes of them: no wrong token
        ("37+48=85. 85-12=73. \\boxed{73}", True, None),
        ("37+48-12=73. \\boxed{73}", True, None),  # steps merged (skipped)
        ("37+48=85. \\boxed{73}", True, None),  # the last step not written
        ("\\boxed{73}", True, None),  # the warm-up's shortcut, right
        ("37+48=85. 85-1", False, None),  # truncated while still a prefix of a correct solution
        ("", False, None),
        # wrong ones, by hand: the index of the first character no correct solution writes there
        ("37+48=86. 86-12=74. \\boxed{74}", True, 7),  # 37+48=8|6: a 5 was due
        ("37+48=85. 85-12=72. \\boxed{72}", True, 17),  # 37+48=85. 85-12=7|2
        ("37+48=85. 85-12=73. \\boxed{75}", True, 28),  # a wrong box after correct steps: \boxed{7|5
        ("37+48-12=71. \\boxed{71}", True, 10),  # a skipped step with a wrong value: 37+48-12=7|1
        ("\\boxed{70}", True, 8),  # a wrong guess: \boxed{7|0
        ("\\boxed{-73}", True, 7),  # \boxed{|-
        ("37+48=84. 84-1", False, 7),  # truncated after a mistake
        ("37+48=8. ", False, 7),  # 37+48=8|.: the 5 was due
        ("37+48=85. 85-12=73.", True, 19),  # stopped (EOS) where " \boxed{73}" was due
        ("37+48=85. 85-12=73. \\boxed{73} ok", True, 30),  # extra text after a right box: its first character
        ("So 37+48=85.", True, 0),  # extra text before
        ("37+48=85.85-12=73. \\boxed{73}", True, 9),  # the format: a space was due
        ("37+12=49. \\boxed{49}", True, 3),  # the operations out of order: 37+|1
    ],
)
def test_first_wrong_token_by_hand(text, eos, expected):
    tokens = _toks(text, eos)
    assert toy.first_wrong_token(P, tokens) == expected
    truth = toy.response_truth(P, tokens)
    assert truth.first_wrong == expected
    assert truth.shared_prefix == list(range(len(tokens) if expected is None else expected))


def test_first_wrong_token_of_multi_character_tokens():
    assert toy.first_wrong_token(P, ["37", "+48", "=86", ".", EOS]) == 2  # the token that holds the wrong "6"
    assert toy.first_wrong_token(P, ["37+48=85.", " ", "", "\\boxed{73}", EOS]) is None  # an empty token is harmless
    assert toy.first_wrong_token(P, ["\\boxed{73}", "<eos>"], eos="<eos>") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("37+48=85. 85-12=73. \\boxed{73}", [6, 7, 16, 17, 27, 28]),
        ("\\boxed{73}", [7, 8]),
        ("1+2= 3. \\boxed{3", [5, 15]),  # a space after "=", a box cut off before its brace
        ("2+2=x. \\boxed{a4b}", [15]),  # no digit after "=": none; the box's digits only
        ("12+3", []),
    ],
)
def test_result_digits_by_hand(text, expected):
    assert toy.result_digits(_toks(text)) == expected
    assert toy.response_truth("Compute 1+2.", _toks(text)).result_digits == expected


def test_register_fills_the_generic_modules_registries():
    """toy.register (conftest calls it, as every entry point does) adds the toy to registries that name no toy:
    the model folder, the data, the auto template and recipe, the recipe check; and the truth of a response."""
    import rollout
    from trainer import policy, problems, recipes, samples_summary

    toy.register()
    toy.register()  # again: nothing doubles
    assert policy.model_path("toy") == toy.ensure_toy_model()
    assert problems.load_problems("toy", split="test") == toy.load_split("test")
    assert problems.resolve_benchmarks("toy") == [("toy", "toy")]
    assert rollout.resolve_template("auto", "toy") == "none"
    assert rollout.resolve_template("auto", "Qwen/Qwen3-8B-Base") == "qwen_math"
    assert recipes.auto_recipe("toy") == "toy" and recipes.auto_recipe("Qwen/Qwen3-8B-Base") == "delta_paper"
    assert rollout.AUTO_TEMPLATES.count(toy._auto_template) == 1 and recipes.CHECKS.count(toy._check_recipe) == 1
    assert toy.logged_truth("Compute 2+3.\n", list("\\boxed{6}") + ["</s>"]) == {
        "first_wrong": 7,
        "result_digits": [7],
    }
    assert toy.logged_truth("no problem here", ["a"]) is None
    assert samples_summary.TRUTH["toy"] is toy.logged_truth  # its truth, for samples/summary.json and the report
