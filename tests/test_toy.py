"""The shipped toy base model (toy_model/) is the one today's recipe builds, and toy.py can tell a rebuild from it;
the truth of a toy response (its first wrong token, shared prefix, result digits) on hand-made responses."""

import json
from pathlib import Path

import pytest

import toy


def test_shipped_toy_model_is_todays_recipe():
    assert toy.ensure_toy_model() == str(toy.SHIPPED) and toy.SHIPPED == Path(toy.__file__).parent / "toy_model"
    info = json.loads((toy.SHIPPED / "toy_info.json").read_text())
    assert info == {"version": toy.TOY_VERSION, "warmup_steps": toy.WARMUP["steps"], "seed": 0,
                    "warmup": toy.WARMUP, "model": toy.MODEL}
    assert sum(f.stat().st_size for f in toy.SHIPPED.iterdir()) < 5e6  # a few MB in the repository


def test_compare_models_tells_identical_from_different(tmp_path):
    same_a, same_b = (toy.build_toy_model(tmp_path / name, warmup_steps=0, seed=0) for name in ("a", "b"))
    other = toy.build_toy_model(tmp_path / "c", warmup_steps=0, seed=1)
    assert toy.compare_models(same_a, same_b) == {"identical": True, "max_abs_weight_diff": 0.0, "ok": True}
    res = toy.compare_models(other, same_a, evaluate_if_different=False)
    assert not res["identical"] and not res["ok"] and res["max_abs_weight_diff"] > 0


def test_a_clone_without_the_shipped_model_builds_it_once(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(toy, "SHIPPED", tmp_path / "missing")
    monkeypatch.setenv("RLVR_TOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(toy, "build_toy_model", lambda path: built.append(path) or Path(path).mkdir(parents=True)
                        or (Path(path) / "config.json").write_text("{}"))
    first = toy.ensure_toy_model()
    assert first == str(toy.cache_dir()) and first.startswith(str(tmp_path / "cache")) and len(built) == 1
    assert toy.ensure_toy_model() == first and len(built) == 1  # cached: built once


# --------------------------------------------------------------------------------------------- the truth of a response
P = "Compute 37+48-12."  # 37+48=85, 85-12=73
EOS = "</s>"


def _toks(text, eos=True):
    """A response's tokens as samples/ logs them for the character-level toy tokenizer."""
    return list(text) + [EOS] * eos


def test_correct_solutions_follow_the_grammar():
    assert toy.parse_problem("Compute 37+48-12.\n") == (37, [("+", 48), ("-", 12)])
    assert toy.correct_solutions(P) == ["\\boxed{73}", "37+48=85. \\boxed{73}", "37+48=85. 85-12=73. \\boxed{73}",
                                        "37+48-12=73. \\boxed{73}"]
    assert toy.correct_solutions("<prompt> Compute 6-4.") == ["\\boxed{2}", "6-4=2. \\boxed{2}"]
    # what the warm-up writes without mistakes is among them
    chain = [(37, "+", 48, 85), (85, "-", 12, 73)]
    assert toy.worked_solution(chain) in toy.correct_solutions(P)
    with pytest.raises(ValueError, match="not a toy problem"):
        toy.parse_problem("What is 2+2?")


@pytest.mark.parametrize("text, eos, expected", [
    # correct solutions and prefixes of them: no wrong token
    ("37+48=85. 85-12=73. \\boxed{73}", True, None),
    ("37+48-12=73. \\boxed{73}", True, None),          # steps merged (skipped)
    ("37+48=85. \\boxed{73}", True, None),             # the last step not written
    ("\\boxed{73}", True, None),                       # the warm-up's shortcut, right
    ("37+48=85. 85-1", False, None),                   # truncated while still a prefix of a correct solution
    ("", False, None),
    # wrong ones, by hand: the index of the first character no correct solution writes there
    ("37+48=86. 86-12=74. \\boxed{74}", True, 7),      # 37+48=8|6: a 5 was due
    ("37+48=85. 85-12=72. \\boxed{72}", True, 17),     # 37+48=85. 85-12=7|2
    ("37+48=85. 85-12=73. \\boxed{75}", True, 28),     # a wrong box after correct steps: \boxed{7|5
    ("37+48-12=71. \\boxed{71}", True, 10),            # a skipped step with a wrong value: 37+48-12=7|1
    ("\\boxed{70}", True, 8),                          # a wrong guess: \boxed{7|0
    ("\\boxed{-73}", True, 7),                         # \boxed{|-
    ("37+48=84. 84-1", False, 7),                      # truncated after a mistake
    ("37+48=8. ", False, 7),                           # 37+48=8|.: the 5 was due
    ("37+48=85. 85-12=73.", True, 19),                 # stopped (EOS) where " \boxed{73}" was due
    ("37+48=85. 85-12=73. \\boxed{73} ok", True, 30),  # extra text after a right box: its first character
    ("So 37+48=85.", True, 0),                         # extra text before
    ("37+48=85.85-12=73. \\boxed{73}", True, 9),       # the format: a space was due
    ("37+12=49. \\boxed{49}", True, 3),                # the operations out of order: 37+|1
])
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


@pytest.mark.parametrize("text, expected", [
    ("37+48=85. 85-12=73. \\boxed{73}", [6, 7, 16, 17, 27, 28]),
    ("\\boxed{73}", [7, 8]),
    ("1+2= 3. \\boxed{3", [5, 15]),           # a space after "=", a box cut off before its brace
    ("2+2=x. \\boxed{a4b}", [15]),            # no digit after "=": none; the box's digits only
    ("12+3", []),
])
def test_result_digits_by_hand(text, expected):
    assert toy.result_digits(_toks(text)) == expected
    assert toy.response_truth("Compute 1+2.", _toks(text)).result_digits == expected
