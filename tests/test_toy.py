"""The shipped toy base model (toy_model/) is the one today's recipe builds, toy.py decides once which folder
``--model toy`` loads, and bench/toy_rebuild.py (.ci/run's rebuild check) can tell a rebuild from the shipped model."""

import json
import shutil
from pathlib import Path

import pytest
import torch

import toy
from bench import toy_rebuild


def test_shipped_toy_model_is_todays_recipe():
    assert toy.ensure_toy_model() == str(toy.SHIPPED) and toy.SHIPPED == Path(toy.__file__).parent / "toy_model"
    info = json.loads((toy.SHIPPED / "toy_info.json").read_text())
    assert info == {"version": toy.TOY_VERSION, "warmup_steps": toy.WARMUP["steps"], "seed": 0,
                    "warmup": toy.WARMUP, "model": toy.MODEL}
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
    assert res["ok"] == all(abs(res["rebuilt"][k] - res["shipped"][k]) <= toy_rebuild.REBUILD_TOLERANCE
                            for k in ("greedy", "avg@8"))
    (tmp_path / "d").mkdir()
    from safetensors.torch import save_file
    save_file({"other.weight": torch.zeros(1)}, tmp_path / "d" / "model.safetensors")
    with pytest.raises(ValueError, match="hold different tensors"):
        toy.compare_weights(tmp_path / "d", same_a)


def test_rebuild_check_passes_when_the_recipe_makes_the_shipped_model(tmp_path, monkeypatch, capsys):
    # the 7-minute warm-up replaced by a copy of the shipped folder: the script's path from build to verdict
    monkeypatch.setattr(toy, "build_toy_model", lambda path: shutil.copytree(toy.SHIPPED, path))
    assert toy_rebuild.main(["--output", str(tmp_path)]) == 0
    assert "identical weights to the shipped toy_model/" in capsys.readouterr().out
    assert (tmp_path / "model" / "model.safetensors").exists()
    monkeypatch.setattr(toy, "SHIPPED", tmp_path / "missing")
    with pytest.raises(SystemExit, match="no shipped model to compare with"):
        toy_rebuild.main([])


def test_a_clone_without_the_shipped_model_builds_it_once(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(toy, "SHIPPED", tmp_path / "missing")
    monkeypatch.setenv("RLVR_TOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(toy, "build_toy_model", lambda path: built.append(path) or Path(path).mkdir(parents=True)
                        or (Path(path) / "config.json").write_text("{}"))
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
