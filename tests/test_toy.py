"""The shipped toy base model (toy_model/) is the one today's recipe builds, and toy.py can tell a rebuild from it."""

import json
from pathlib import Path

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
