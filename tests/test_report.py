"""report.py (the HTML run report), the per-token samples it reads, and --report_to's experiment trackers.

The page is checked with Python's html.parser here; `python -m pytest -q -m browser` renders it in headless
Chromium (left out of the default run, pyproject.toml; .ci/run installs Debian's chromium and runs it).
"""

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import comparisons
import grpo
from tools import report
from trainer import checkpoint, grpo_config, run_setup, samples_summary


# ------------------------------------------------------------------------------------------------ page parsing
class Page(HTMLParser):
    """The parts of a report page the tests look at: token spans (with their run, title and class), run columns,
    the summary table's run names, and anything that would load from elsewhere."""

    def __init__(self, text):
        super().__init__()
        self.tokens, self.columns, self.table_runs, self.external, self.scripts = [], [], [], [], 0
        self._run, self._depth, self._tok, self._in_row = None, 0, None, False
        self._stack = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in ("br", "meta", "line", "rect", "circle", "polygon", "stop", "polyline"):
            self._stack.append((tag, a))
        if tag == "script":
            self.scripts += 1
        for k in ("src", "href"):
            if a.get(k) and not a[k].startswith("#"):
                self.external.append(a[k])
        if tag == "div" and "data-run" in a:
            self.columns.append(a["data-run"])
        if tag == "i" and "title" in a:
            run = next((x["data-run"] for t, x in reversed(self._stack) if "data-run" in x), None)
            self._tok = {"run": run, "title": a["title"], "class": a.get("class", ""), "text": ""}

    def handle_endtag(self, tag):
        if tag == "i" and self._tok is not None:
            self.tokens.append(self._tok)
            self._tok = None
        while self._stack:
            t, _ = self._stack.pop()
            if t == tag:
                break

    def handle_data(self, data):
        if self._tok is not None:
            self._tok["text"] += data
        if self._stack and self._stack[-1][0] == "b" and any(a.get("class") == "run" for _, a in self._stack):
            self.table_runs.append(data)


def _self_contained(text):
    low = text.lower()
    return not any(s in low for s in ("<script", "<link", "@import", "url(http", 'src="http', 'href="http'))


# ------------------------------------------------------------------------------------------------ samples/
@pytest.fixture
def char_tokenizer(tiny):
    return tiny[1]


def _batch(tok, texts, finish, T):
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    rows, mask = [], []
    for r, f in zip(ids, finish):
        r = r + ([tok.eos_token_id] if f == "stop" else [])
        rows.append(r + [tok.pad_token_id] * (T - len(r)))
        mask.append([1.0] * len(r) + [0.0] * (T - len(r)))
    return types.SimpleNamespace(
        response_ids=torch.tensor(rows),
        response_mask=torch.tensor(mask),
        prompts=["p:"] * len(texts),
        texts=texts,
        finish_reasons=finish,
        num_generations=len(texts),
    )


@pytest.mark.parametrize("weight_name", ["lam_bar", "sensitivity", None])
def test_samples_hold_tokens_and_credit(tmp_path, char_tokenizer, weight_name):
    """tokens: each response token decoded alone (EOS included); credit: Ã_{i,t}/Â_i on rows with Â ≠ 0; on
    Â = 0 rows DelTA's λ̄ (a multiplier of Â) or 1 (CSCR's sensitivity is not one; GRPO has no weights)."""
    tok = char_tokenizer
    batch = _batch(tok, ["1+2=3", "7", "ab", "9 9"], ["stop", "stop", "stop", "length"], T=6)
    adv = torch.tensor([2.0, -0.5, 0.0, 1.0])
    weights = torch.tensor(
        [[0.8, 1.2, 1.0, 0.9, 1.1, 1.0], [1.1, 0.7, 0, 0, 0, 0], [0.9, 1.3, 1.05, 0, 0, 0], [1.0, 1.0, 1.0, 0, 0, 0]]
    )
    token_adv = adv[:, None] * (weights if weight_name else torch.ones(4, 6)) * batch.response_mask
    run = checkpoint.RunFolder(str(tmp_path), {})
    os.makedirs(tmp_path / "samples")
    # the credit's per-token values decide what a token's credit is (run_setup.credit_shares); samples/ writes it
    token_values = {weight_name: weights} if weight_name else {}
    logged = run_setup.StepLog(batch, torch.tensor([1.0, 0.0, 1.0, 0.0]), None, None, None, adv, token_adv)
    update = grpo.Update(batch, None, token_adv, batch.response_mask, token_values, parts=None)  # (no update runs)
    cfg = grpo.GRPOConfig(num_generations=4, num_samples_to_log=1, logging_steps=1)
    run_setup.write_samples(run, 2, cfg, tok, logged, update)
    rows = [json.loads(l) for l in (tmp_path / "samples" / "step_000003.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [
        ["1", "+", "2", "=", "3", "</s>"],
        ["7", "</s>"],
        ["a", "b", "</s>"],
        ["9", " ", "9"],
    ]
    expect = [[0.8, 1.2, 1.0, 0.9, 1.1, 1.0], [1.1, 0.7], [0.9, 1.3, 1.05], [1.0, 1.0, 1.0]]
    if weight_name != "lam_bar":
        expect[2] = [1.0, 1.0, 1.0]  # Â = 0 and no multiplier to show: 1
    if weight_name is None:
        expect = [[1.0] * len(e) for e in expect]
    for r, e in zip(rows, expect):
        assert r["credit"] == pytest.approx(e, abs=1e-4)
    assert [r["advantage"] for r in rows] == [2.0, -0.5, 0.0, 1.0]
    for key in ("prompt", "response", "reward", "finish_reason"):  # the keys other code reads stay
        assert key in rows[0]
    if weight_name:
        assert rows[0][weight_name] == pytest.approx(weights[0].tolist(), abs=1e-4)  # per token, as rows[0]["tokens"]
        assert rows[0]["token_advantages"] == pytest.approx([1.6, 2.4, 2.0, 1.8, 2.2, 2.0])
        assert weight_name not in rows[2]  # Â = 0: no per-token values, as before


def test_samples_of_a_truncated_response_left_out_of_the_loss(tmp_path, char_tokenizer):
    """--mask_truncated_completions zeroes a truncated row's mask: its tokens are still shown, with credit 0."""
    batch = _batch(char_tokenizer, ["12", "345"], ["stop", "length"], T=3)
    batch.response_mask[1] = 0
    adv = torch.tensor([1.0, -1.0])
    run = checkpoint.RunFolder(str(tmp_path), {})
    os.makedirs(tmp_path / "samples")
    token_adv = adv[:, None] * batch.response_mask
    logged = run_setup.StepLog(batch, torch.tensor([1.0, 0.0]), None, None, None, adv, token_adv)
    update = grpo.Update(batch, None, token_adv, batch.response_mask, {}, parts=None)
    cfg = grpo.GRPOConfig(num_generations=2, num_samples_to_log=1, logging_steps=1)
    run_setup.write_samples(run, 0, cfg, char_tokenizer, logged, update)
    rows = [json.loads(l) for l in (tmp_path / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert rows[1]["tokens"] == ["3", "4", "5"] and rows[1]["credit"] == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------------------ the colour scale
def test_colour_scale_is_logarithmic_and_centred_at_one():
    L = report.LEVELS
    assert report.level(1.0, 2.0) == 0 and report.colour(0.0) == "#ffffff"
    assert report.level(2.0, 2.0) == L and report.level(0.5, 2.0) == -L  # double and half: the two ends
    assert report.level(math.sqrt(2), 2.0) == L // 2 and report.level(1 / math.sqrt(2), 2.0) == -L // 2
    assert report.level(100.0, 2.0) == L and report.level(0.0, 2.0) == -L  # beyond the ends: clamped
    assert report.colour(1.0) == report.MORE[-1] and report.colour(-1.0) == report.LESS[-1]
    # halfway between two stops: the mean of their channels
    a, b = report.MORE[1], report.MORE[2]
    mid = report.colour(1.5 / (len(report.MORE) - 1))
    assert [int(mid[k : k + 2], 16) for k in (1, 3, 5)] == [
        round((int(a[k : k + 2], 16) + int(b[k : k + 2], 16)) / 2) for k in (1, 3, 5)
    ]


def test_histogram_bins_on_the_log_axis():
    # R = 2, 40 bins over log2 c ∈ [−1, 1]: 0.5 -> bin 0, 1 -> bin 20, √2 -> bin 30, 2 -> bin 39 (the last);
    # 0.25 and 4 lie beyond the ends and count in the end bins
    counts = report.bin_counts([0.5, 0.25, 1.0, math.sqrt(2) * 1.0001, 2.0, 4.0], 2.0)
    assert {k: v for k, v in enumerate(counts) if v} == {0: 2, 20: 1, 30: 1, 39: 2}
    svg = report.histogram(counts, 2.0, ymax=0.25)
    assert svg.count("<rect") == 4 and "33.3% of tokens" in svg and "16.7% of tokens" in svg
    assert svg.count(">33%</text>") == 2  # the bars above the shared top (25%) are cut and labelled


# ------------------------------------------------------------------------------------------------ hand-made runs
def _write_run(folder, credit, steps, rows_of, evals=True):
    """A run folder as grpo.py writes it, with ``rows_of(step)`` as each step's logged responses."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"credit": credit, "seed": 0}}))
    lines = [{"step": 0, "eval/avg@8": 0.4, "eval/greedy": 0.9}] if evals else []
    for s in steps:
        rec = {"step": s, "reward": 0.5 + 0.01 * s, "completions/mean_length": 20.0 + s}
        if credit == "delta":
            rec.update(
                {
                    f"delta/lam_{side}_{k}": v
                    for side in ("pos", "neg")
                    for k, v in (("mean", 1.0), ("std", 0.1), ("min", 0.8), ("max", 1.2))
                }
            )
        if credit == "cscr":
            rec.update(
                {"cscr/w_mean": 0.9, "cscr/frac_w_lt_1": 0.2, "cscr/w_tilde_max": 1.3, "cscr/eff_token_frac": 0.95}
            )
        lines.append(rec)
    if evals:
        lines.append({"step": steps[-1], "eval/avg@8": 0.8, "eval/greedy": 0.95})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    (folder / "samples").mkdir()
    for s in steps:
        (folder / "samples" / f"step_{s:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_of(s)))
    return str(folder)


def _rows(credits, prompt="Compute 1+2.\n"):
    """Logged responses: one per credit list (tokens "a", "b", ...), the first correct with Â > 0."""
    out = []
    for k, c in enumerate(credits):
        toks = [chr(97 + j) for j in range(len(c))]
        out.append(
            {
                "prompt": prompt,
                "response": "".join(toks),
                "reward": float(k == 0),
                "advantage": 0.0 if len(credits) == 1 else (1.0 if k == 0 else -1.0),
                "finish_reason": "stop",
                "tokens": toks,
                "credit": c,
            }
        )
    return out


@pytest.fixture
def three_runs(tmp_path):
    g = _write_run(tmp_path / "grpo", "grpo", [1, 2], lambda s: _rows([[1.0, 1.0], [1.0, 1.0, 1.0]]))
    d = _write_run(tmp_path / "delta", "delta", [1, 2], lambda s: _rows([[0.8, 1.25], [1.1, 0.9, 1.0]]))
    c = _write_run(tmp_path / "cscr", "cscr", [1, 2], lambda s: _rows([[0.5, 1.5], [1.2, 0.6, 1.2]]))
    return [g, d, c]


def test_report_paints_every_logged_token_with_its_credit(three_runs, tmp_path):
    out = tmp_path / "report.html"
    report.main([*three_runs, "--output", str(out)])
    text = out.read_text()
    page = Page(text)
    assert _self_contained(text) and page.scripts == 0 and page.external == []
    assert page.table_runs == ["grpo", "delta", "cscr"]
    # the same prompt at the same step: one card with the three runs side by side, for each of the two steps
    assert page.columns == ["grpo", "delta", "cscr"] * 2
    R = 2.0  # the largest deviation, 1.5 / 0.5 on a log scale, rounded up to a labelled end
    expect = {"grpo": [1.0] * 5, "delta": [0.8, 1.25, 1.1, 0.9, 1.0], "cscr": [0.5, 1.5, 1.2, 0.6, 1.2]}
    for run, credits in expect.items():
        toks = [t for t in page.tokens if t["run"] == run]
        assert len(toks) == 2 * len(credits)  # every token of both steps
        assert [float(t["title"].split("=")[-1]) for t in toks] == credits * 2
        assert toks[0]["title"].startswith(report.SYMBOL[run] + "=")
        assert [t["class"] for t in toks] == [f"c{report.level(c, R) + report.LEVELS}" for c in credits] * 2
        assert "".join(t["text"] for t in toks[:2]) == "ab"
    assert f".c{2 * report.LEVELS}{{background:{report.MORE[-1]}" in text  # credit ≥ R: the darkest orange
    for title in ("training reward", "held-out avg@8", "DelTA λ̄, tokens of Â &gt; 0", "CSCR largest w̃"):
        assert title in text
    assert text.count("<svg") == 1 + 10 + 3  # colour bar, a chart per metric logged (not cos_mu), 3 histograms


def test_runs_with_other_prompts_and_zero_advantage(tmp_path):
    """A prompt one run did not log at that step is said so; an Â = 0 response is faded and named."""
    a = _write_run(tmp_path / "a", "delta", [1], lambda s: _rows([[0.9, 1.1]]))  # one response: Â = 0
    b = _write_run(tmp_path / "b", "grpo", [1], lambda s: _rows([[1.0], [1.0]], prompt="Compute 5-4.\n"))
    page_text = report.build_report(report.load_runs([a, b], say=lambda _: None))[0]
    assert page_text.count("not among this run's logged prompts") == 2
    assert 'class="resp zero" title="Â = 0: no gradient"' in page_text
    assert [t["title"] for t in Page(page_text).tokens if t["run"] == "a"] == ["λ̄=0.9000", "λ̄=1.1000"]


def test_bad_folders_get_one_line_and_the_others_are_reported(three_runs, tmp_path, capsys):
    (tmp_path / "notarun").mkdir()
    empty = _write_run(tmp_path / "nosamples", "grpo", [1], lambda s: [])
    broken = _write_run(tmp_path / "broken", "grpo", [1], lambda s: _rows([[1.0]]))
    with open(Path(broken) / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    out = tmp_path / "r.html"
    (tmp_path / "old.html").write_text("<html></html>")  # an earlier page, e.g. met by `python tools/report.py runs/*`
    report.main(
        [
            str(tmp_path / "notarun"),
            three_runs[1],
            empty,
            broken,
            str(tmp_path / "missing"),
            str(tmp_path / "old.html"),
            "--output",
            str(out),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5
    assert (
        err[0] == f"report.py: skipping {tmp_path / 'notarun'}: not a run folder of grpo.py (it has no metrics.jsonl)"
    )
    assert "nosamples has no samples/step_*.jsonl" in err[1]
    assert "broken/metrics.jsonl line 4: not a JSON object" in err[2]
    assert err[3] == f"report.py: skipping {tmp_path / 'missing'}: no such folder"
    assert err[4] == f"report.py: skipping {tmp_path / 'old.html'}: a file, not a run folder"
    page = Page(out.read_text())
    assert page.table_runs == ["delta", "nosamples"] and set(page.columns) == {"delta", "nosamples"}
    with pytest.raises(SystemExit, match="none of the folders is a run"):
        report.main([str(tmp_path / "notarun"), "--output", str(out)])


def test_a_torn_last_line_is_left_out_in_one_line_and_the_rest_is_reported(tmp_path, capsys):
    """A run in progress (or killed mid-write) whose metrics.jsonl and a samples file end in half a line: what is
    complete is read, the torn lines are named in one line, and the page still shows the run."""
    run = Path(_write_run(tmp_path / "live", "delta", [1, 2], lambda s: _rows([[0.9, 1.1], [1.0, 1.2]])))
    whole_metrics = report.load_run(str(run), say=None).metrics
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')
    sample = run / "samples" / "step_000002.jsonl"
    complete = sample.read_text().splitlines(keepends=True)
    sample.write_bytes((complete[0] + complete[1][:39]).encode() + "λ".encode()[:1])  # torn inside a character
    said = []
    r = report.load_run(str(run), say=said.append)
    assert r.metrics == whole_metrics and len(r.metrics) == 4
    assert len(r.samples[1]) == 2 and r.samples[2] == [json.loads(complete[0])]
    assert len(said) == 1
    assert f"{run / 'metrics.jsonl'} line 5: left out a torn last line (16 bytes, no newline)" in said[0]
    assert f"{sample} line 2: left out a torn last line (40 bytes, no newline)" in said[0]
    # through the command line: the one line on stderr, and the run is on the page
    out = tmp_path / "r.html"
    report.main([str(run), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torn last line" in err[0] and "skipping" not in err[0]
    assert Page(out.read_text()).table_runs == ["live"]


@pytest.mark.parametrize(
    "text, line",
    [
        ('{"step": 1}\n{"step": 2\n{"step": 3}\n', 2),  # torn in the middle: an error, not a torn last line
        ('{"step": 1}\n{"step": 2\n', 2),  # a broken last line that has its newline was written whole: an error
        ('{"step": 1}\n[1, 2]', 2),  # no newline, but a whole JSON value that is not an object
    ],
)
def test_a_bad_line_other_than_a_torn_last_one_is_an_error_naming_file_and_line(tmp_path, text, line):
    run = Path(_write_run(tmp_path / "bad", "grpo", [1], lambda s: _rows([[1.0]])))
    (run / "metrics.jsonl").write_text(text)
    message = "^" + re.escape(f"{run / 'metrics.jsonl'} line {line}: not a JSON object") + "$"
    with pytest.raises(samples_summary.RunError, match=message):
        report.load_run(str(run), say=None)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    sample = run / "samples" / "step_000001.jsonl"
    sample.write_text(text.replace('{"step"', '{"prompt": "p", "response": "r", "reward": 1, "advantage": 0, "s"'))
    with pytest.raises(
        samples_summary.RunError, match="^" + re.escape(f"{sample} line {line}: not a JSON object") + "$"
    ):
        report.load_run(str(run), say=None)


def test_output_in_a_new_folder_or_an_unwritable_one(three_runs, tmp_path):
    """--output in a folder that does not exist yet makes it; one that cannot be written stops with one line."""
    out = report.main([*three_runs, "--output", str(tmp_path / "new" / "deeper" / "page.html")])
    assert os.path.isfile(out)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=r"report.py: error: --output .*a_file/page.html cannot be written"):
        report.main([*three_runs, "--output", str(blocker / "page.html")])


def test_default_output_is_a_place_the_runs_own(three_runs, tmp_path, monkeypatch, capsys):
    """Without --output the page goes next to the runs (their common folder, here tmp_path/report.html; one run: its
    own folder), never into the working directory (the repository root, which git does not ignore), and the line
    printed says where."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert report.default_output(three_runs) == os.path.join("..", "report.html")
    assert report.default_output(three_runs[1:2]) == os.path.join("..", "delta", "report.html")
    out = report.main(three_runs[1:2])
    assert (tmp_path / "delta" / "report.html").exists() and f"wrote {out}" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # the runs' common folder is the working directory: the first run's folder
    assert report.default_output(three_runs) == os.path.join("grpo", "report.html")


def test_steps_shown(three_runs, monkeypatch):
    runs = report.load_runs(three_runs)
    assert report.pick_steps(runs, "auto") == ([1, 2], [1, 2])
    assert report.pick_steps(runs, "2") == ([1, 2], [2])
    with pytest.raises(ValueError, match="--steps 7: none of them was logged"):
        report.pick_steps(runs, "7")
    with pytest.raises(ValueError, match="expected auto, all or step numbers"):
        report.pick_steps(runs, "last")
    many = [report.Run("x", "x", "grpo", {}, {s: _rows([[1.0] * 10]) for s in range(1, 101)}, [], {})]
    monkeypatch.setattr(report, "TOKEN_BUDGET", 200)  # 1000 tokens logged: a fifth of the steps fit
    logged, shown = report.pick_steps(many, "auto")
    assert len(logged) == 100 and len(shown) == 20 and shown[0] == 1 and shown[-1] == 100
    assert report.pick_steps(many, "all")[1] == logged


# ----------------------------------------------------------------------------------------------- where the credit lands
def _toy_row(text, reward, adv, credit_of, finish="stop", prompt="Compute 2+3.\n"):
    """A logged toy response (answer 5): its characters as tokens (EOS when it stopped), credit_of(k) per token, and
    its truth as report.py computes it when it reads a toy run (``toy.logged_truth``)."""
    import toy

    toks = list(text) + ["</s>"] * (finish == "stop")
    return {
        "prompt": prompt,
        "response": text,
        "reward": reward,
        "advantage": adv,
        "finish_reason": finish,
        "tokens": toks,
        "credit": [credit_of(k) for k in range(len(toks))],
        "truth": toy.logged_truth(prompt, toks),
    }


def _toy_steps(grpo=False):
    """Two logged steps with known truth (first wrong token, result digits) and credits chosen by hand; GRPO: 1."""
    c = (lambda d, other: lambda k: 1.0) if grpo else (lambda d, other: lambda k: d.get(k, other))
    return {
        1: [
            _toy_row("\\boxed{5}", 1.0, 1.0, c({7: 0.5}, 1.0)),  # correct, digit at 7
            _toy_row("\\boxed{6}", 0.0, -1.0, c({7: 2.0, 9: 0.5}, 1.0)),  # first wrong at 7
            _toy_row("\\boxed{7}", 0.0, 0.0, c({}, 9.0)),
        ],  # Â = 0: left out
        2: [
            _toy_row("2+3=5. \\boxed{5}", 1.0, 0.5, c({14: 3.0}, 1.0)),  # digits at 4 and 14
            _toy_row("2+3=4. \\boxed{4}", 0.0, -0.5, c({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}, 1.5)),
            _toy_row("2+3=5. \\box", 0.0, -0.5, c({}, 0.7), finish="length"),  # a prefix: no wrong token
            _toy_row("2+9", 0.0, -0.5, lambda k: 0.0, finish="length"),
        ],
    }  # masked out of the loss


@pytest.fixture
def toy_hand_runs(tmp_path):
    """A DelTA-like and a GRPO run on the toy (config data: toy) with the rows of ``_toy_steps`` as grpo.py writes
    them (no truth: report.py computes it), and a run that is not on the toy."""
    runs = []
    for name, grpo_like in (("grpo", True), ("delta", False)):
        steps = {
            s: [{k: v for k, v in row.items() if k != "truth"} for row in rows]
            for s, rows in _toy_steps(grpo_like).items()
        }
        path = _write_run(tmp_path / name, name, [1, 2], lambda s: steps[s])
        cfg = json.loads((Path(path) / "config.json").read_text())
        cfg["config"]["data"] = "toy"
        (Path(path) / "config.json").write_text(json.dumps(cfg))
        runs.append(path)
    runs.append(_write_run(tmp_path / "other", "cscr", [1, 2], lambda s: _rows([[0.5, 1.5], [1.2, 0.6, 1.2]])))
    return runs


def test_the_toy_truth_is_computed_where_it_is_read(toy_hand_runs):
    """A toy run's samples/ rows carry no truth; load_run adds each one's (toy.logged_truth of its prompt and tokens),
    and adds none to a run that is not on the toy."""
    expected = _toy_steps(False)
    run = report.load_run(toy_hand_runs[1])
    assert {s: [row["truth"] for row in rows] for s, rows in run.samples.items()} == {
        s: [row["truth"] for row in rows] for s, rows in expected.items()
    }
    assert all("truth" in row for rows in run.samples.values() for row in rows)
    other = report.load_run(toy_hand_runs[2])
    assert not any("truth" in row for rows in other.samples.values() for row in rows)


def test_credit_lands_of_a_step_whose_classes_are_empty():
    """A step whose only incorrect response is wrong from its first token (no shared prefix) and whose only correct
    one has no result digit outside the box's: the class is absent at that step, not a division by zero."""
    rows = {
        1: [
            _toy_row("9", 0.0, -1.0, lambda k: 2.0 if k == 0 else 1.0),  # first wrong at 0
            _toy_row("\\boxed{5}", 1.0, 1.0, lambda k: 1.0),
        ],
        2: [_toy_row("\\boxed{7}", 0.0, -1.0, lambda k: 0.5 if k == 7 else 1.0)],
    }  # a prefix of 7 tokens
    d = samples_summary.credit_lands(samples_summary.RunSamples("x", "x", "delta", {"data": "toy"}, rows))
    prefix = d["classes"]["prefix"]
    assert prefix["count"] == 7 and [s for s, _, _ in prefix["per_step"]] == [2] and prefix["mean"] == 1.0
    assert d["classes"]["first_wrong"]["per_step"] == [[1, 2.0, 1], [2, 0.5, 1]]


def test_credit_lands_by_hand(toy_hand_runs):
    """Each class's mean credit, its per-step spread and count, and the AUROCs, against hand computation."""
    delta = report.load_run(toy_hand_runs[1])
    d = samples_summary.credit_lands(delta)
    assert d["responses"] == {"correct": 2, "incorrect": 2, "no_wrong_token": 1, "no_gradient": 2, "not_toy": 0}
    expect = {  # mean over tokens, count, (per-step means)
        "first_wrong": (1.25, 2, [2.0, 0.5]),  # step 1: 2.0; step 2: 0.5
        "prefix": (9 / 11, 11, [1.0, 0.5]),  # 7 × 1.0; 4 × 0.5
        "after": (19.5 / 14, 14, [0.75, 1.5]),  # [1.0, 0.5]; 12 × 1.5
        "result_digits": (1.5, 3, [0.5, 2.0]),  # [0.5]; [1.0, 3.0]
        "other": (1.0, 24, [1.0, 1.0]),
    }  # 9 and 15 tokens of 1.0
    for key, (mean, count, steps) in expect.items():
        got = d["classes"][key]
        assert got["mean"] == pytest.approx(mean) and got["count"] == count, key
        assert [m for _, m, _ in got["per_step"]] == pytest.approx(steps), key
        assert (got["step_min"], got["step_max"]) == pytest.approx((min(steps), max(steps)))
        assert got["step_std"] == pytest.approx(abs(steps[0] - steps[1]) / 2)  # population std of two values
    # AUROC per response, ties ½: step 1, "6" (2.0) above all 9 others -> 1; step 2, "4" (0.5) ties its 4-token
    # prefix and lies below the 12 tokens after it -> (4 × ½) / 16 = 0.125. Digits: step 1, 0.5 below 9 × 1.0 -> 0;
    # step 2, 1.0 ties 15 others and 3.0 tops them -> (7.5 + 15) / 30 = 0.75.
    fw, dig = d["auroc"]["first_wrong"], d["auroc"]["result_digits"]
    assert [m for _, m, _ in fw["per_step"]] == pytest.approx([1.0, 0.125]) and fw["mean"] == pytest.approx(0.5625)
    assert [m for _, m, _ in dig["per_step"]] == pytest.approx([0.0, 0.75]) and dig["mean"] == pytest.approx(0.375)
    assert fw["count"] == dig["count"] == 2
    g = samples_summary.credit_lands(report.load_run(toy_hand_runs[0]))  # GRPO: exactly 1 and exactly 0.5
    assert all(
        v["mean"] == v["step_min"] == v["step_max"] == 1.0 and v["step_std"] == 0.0 for v in g["classes"].values()
    )
    assert all(v["mean"] == 0.5 and all(m == 0.5 for _, m, _ in v["per_step"]) for v in g["auroc"].values())


def test_auroc_is_mann_whitney_with_ties_as_half():
    assert samples_summary.auroc([2.0], [1.0, 1.0, 3.0]) == pytest.approx(2 / 3)
    assert samples_summary.auroc([1.0, 1.0], [1.0] * 5) == 0.5
    assert samples_summary.auroc([1.0, 2.0], [1.0, 0.0]) == pytest.approx((1.5 + 2) / 4)


def test_delta_tokens_by_hand():
    """DelTA's token view: mean λ̄ (= credit) per token and side, tokens seen fewer than min_count times left out."""
    rows = [
        {
            "prompt": "p",
            "response": "aba",
            "reward": 1.0,
            "advantage": 1.0,
            "tokens": ["a", "b", "a"],
            "credit": [1.2, 0.9, 1.0],
        },
        {"prompt": "p", "response": "bc", "reward": 1.0, "advantage": 0.5, "tokens": ["b", "c"], "credit": [0.7, 1.5]},
        {
            "prompt": "p",
            "response": "acc",
            "reward": 0.0,
            "advantage": -1.0,
            "tokens": ["a", "c", "c"],
            "credit": [0.6, 1.3, 1.1],
        },
        {"prompt": "p", "response": "aa", "reward": 0.0, "advantage": 0.0, "tokens": ["a", "a"], "credit": [9, 9]},
        {"prompt": "p", "response": "cc", "reward": 0.0, "advantage": -1.0, "tokens": ["c", "c"], "credit": [0, 0]},
    ]
    run = samples_summary.RunSamples("d", "d", "delta", {}, {1: rows})
    view = samples_summary.delta_tokens(run, min_count=2, top=5)
    pos, neg = view["pos"], view["neg"]
    assert [t for t, _, _ in pos["highest"]] == ["a", "b"] and [t for t, _, _ in pos["lowest"]] == ["b", "a"]
    assert [(m, n) for _, m, n in pos["highest"]] == [(pytest.approx(1.1), 2), (pytest.approx(0.8), 2)]
    assert (pos["tokens"], pos["distinct"], pos["listed"]) == (5, 3, 2)  # "c" (once) left out
    assert neg["highest"] == neg["lowest"] == [["c", pytest.approx(1.2), 2]]
    assert (neg["tokens"], neg["distinct"], neg["listed"]) == (3, 2, 1)


def test_samples_summary_is_the_pages_numbers_of_the_run_alone(toy_hand_runs, tmp_path):
    """samples/summary.json (samples_summary.write_samples_summary, which run_setup.finish calls without tools/): the
    numbers report.py writes to <page>.json for that run alone, the toy's truth computed from the rows as the page
    does; a GRPO run off the toy gets none (no file)."""
    written = samples_summary.write_samples_summary(toy_hand_runs[1])
    on_file = json.loads((Path(toy_hand_runs[1]) / "samples" / "summary.json").read_text())
    page_numbers = report.build_report([report.load_run(toy_hand_runs[1])])[1]["numbers"]
    assert on_file == json.loads(json.dumps(written)) == json.loads(json.dumps(page_numbers))
    assert set(on_file["where_the_credit_lands"]) == set(on_file["delta_tokens"]) == {"delta"}
    off_toy = _write_run(tmp_path / "plain", "grpo", [1], lambda s: _rows([[1.0, 1.0], [1.0]]))
    assert samples_summary.write_samples_summary(off_toy) == {}
    assert not (Path(off_toy) / "samples" / "summary.json").exists()


def test_report_shows_where_the_credit_lands(toy_hand_runs, tmp_path):
    """The section and DelTA's token view on the page, the first wrong tokens marked, the numbers in <page>.json."""
    out = tmp_path / "report.html"
    report.main([*toy_hand_runs, "--output", str(out)])
    text = out.read_text()
    page = Page(text)
    assert _self_contained(text) and 'id="where-the-credit-lands"' in text and 'id="delta-tokens"' in text
    for run in ("grpo", "delta"):  # every incorrect response's first wrong token, Â = 0 and masked ones too
        marked = [t["text"] for t in page.tokens if t["run"] == run and "fw" in t["class"].split()]
        assert sorted(marked) == ["4", "6", "7", "9"]
    assert not [t for t in page.tokens if t["run"] == "other" and "fw" in t["class"].split()]
    numbers = json.loads((tmp_path / "report.json").read_text())
    assert set(numbers["where_the_credit_lands"]) == {"grpo", "delta"} and set(numbers["delta_tokens"]) == {"delta"}
    assert numbers["where_the_credit_lands"]["delta"] == json.loads(
        json.dumps(samples_summary.credit_lands(report.load_run(toy_hand_runs[1])))
    )
    grpo_row = numbers["where_the_credit_lands"]["grpo"]
    assert {k: v["mean"] for k, v in grpo_row["classes"].items()} == dict.fromkeys(
        ("first_wrong", "prefix", "after", "result_digits", "other"), 1.0
    )
    assert {k: v["mean"] for k, v in grpo_row["auroc"].items()} == {"first_wrong": 0.5, "result_digits": 0.5}
    lands = text[text.index('id="where-the-credit-lands"') : text.index('id="delta-tokens"')]
    assert lands.count("<tr>") == 3 and lands.count("<svg") == 2  # header + 2 runs; the two AUROC curves
    assert "<b>1.250</b>" in lands and "<b>0.562</b>" in lands  # delta's first wrong token and its AUROC
    out_plain = tmp_path / "plain.html"  # no toy or delta run: no section, no JSON
    report.main([toy_hand_runs[2], "--output", str(out_plain)])
    assert "where-the-credit-lands" not in out_plain.read_text() and not (tmp_path / "plain.json").exists()


def test_a_report_in_an_interrupted_run_folder_does_not_stop_the_next_run(toy_hand_runs, capsys):
    """report.py's page and its numbers, written into the folder of a run stopped before its first checkpoint, are
    part of that run for the trainer (checkpoint.REPORT_PAGE): the same command starts again there, moving them
    aside with the logs; --resume points to that command, which works (once a circle: the trainer refused the
    folder and sent the user to --resume, which sent them back). Files the trainer did not write stop it, and then
    no message names --resume, which could not continue a run without a checkpoint."""
    run = Path(toy_hand_runs[1])  # a DelTA run on the toy, no checkpoint: report.py writes report.json too
    report.main([str(run)])
    report.main([str(run), "--output", str(run / "delta.html")])  # a page of another name, in the same folder
    written = ["delta.html", "delta.json", "report.html", "report.json"]
    assert sorted(p.name for p in run.iterdir()) == sorted(["config.json", "metrics.jsonl", "samples", *written])
    folder = checkpoint.RunFolder(str(run), {"save_steps": 50}, say=lambda *a: None)
    assert folder.set_aside == sorted(["config.json", "metrics.jsonl", "samples", *written])
    with pytest.raises(
        ValueError,
        match=r"holds no complete checkpoint-<step>/ \(the run stopped before its first "
        r"--save_steps\); run the same command without --resume to start again",
    ):
        checkpoint.RunFolder(str(run), {"resume": True}, say=lambda *a: None)
    said = []
    folder.start(torch.nn.Linear(2, 2), {"prompt_template": "none"})  # the same command: its logs moved aside
    folder.close()
    assert sorted(p.name for p in (run / "interrupted-1").iterdir()) == sorted(
        ["config.json", "metrics.jsonl", "samples", *written]
    )
    (run / "interrupted-1").rename(run.parent / "kept")
    (run / "notes.txt").write_text("mine")  # a file neither the trainer nor report.py writes: not theirs to move
    for config in ({}, {"resume": True}):
        with pytest.raises(ValueError) as e:
            checkpoint.RunFolder(str(run), config, say=said.append)
        assert "notes.txt" in str(e.value) and "--overwrite_output_dir deletes them all" in str(e.value)
        assert "pass --resume" not in str(e.value) and "without --resume" not in str(e.value)


# ------------------------------------------------------------------------------------------------ rule names
def _config(**flags):
    """A run's config.json "config" as python -m comparisons writes it (dataclasses.asdict of its config: grpo.py's
    GRPOConfig and the comparisons' flags)."""
    return dataclasses.asdict(comparisons.config_class()(**flags))


# Every comparison rule of tools/bench/reproduce.py's RULES (and combinations) with the name the page gives it.
RULE_NAMES = [
    (dict(), "grpo"),
    (dict(credit="delta"), "delta"),
    (dict(credit="cscr"), "cscr"),
    (dict(credit="fipo"), "fipo"),  # --fipo's old spelling
    (dict(fipo=True), "fipo"),
    (dict(loss_type="sapo"), "sapo"),
    (dict(entropy_top_ratio=0.2), "forking tokens ρ=0.2"),
    (dict(top_entropy_quantile=0.2), "forking tokens (TRL) ρ=0.2"),
    (dict(credit="delta", delta_scores="within_side"), "delta: within-side scores"),
    (dict(credit="delta", delta_assignment="hard"), "delta: hard assignment"),
    (dict(credit="delta", delta_gamma="frozen"), "delta: frozen γ"),
    (dict(credit="delta", delta_coefficients="raw"), "delta: raw α"),
    (dict(credit="delta", delta_coefficients="random"), "delta: random λ"),
    (dict(credit="delta", delta_normalize=False), "delta: no λ-normalisation"),
    (dict(credit="delta", delta_proxy="topk", delta_proxy_topk=20), "delta: top-K proxy K=20"),
    (dict(credit="delta", delta_k=0), "delta: K=0"),
    (dict(credit="delta", delta_k=3), "delta: K=3"),
    (dict(credit="delta", delta_lam_min=0.5, delta_lam_max=1.5), "delta: λ∈[0.5, 1.5]"),
    (dict(credit="delta", delta_select="top"), "delta Q2: top 50%"),
    (dict(credit="delta", delta_select="random"), "delta Q2: random 50%"),
    (dict(credit="delta", delta_select="bottom", delta_select_fraction=0.25), "delta Q2: bottom 25%"),
    (dict(credit="cscr", cscr_weight="sign_aware"), "cscr: sign-aware"),
    (dict(credit="cscr", cscr_weight="upweight"), "cscr: up-weighting"),
    (dict(credit="cscr", cscr_scope="group"), "cscr: group scope"),
    (dict(credit="cscr", cscr_scope="batch"), "cscr: batch scope"),
    # combinations: the loss-side rules first, then the credit with its settings
    (dict(credit="delta", delta_gamma="frozen", delta_coefficients="raw"), "delta: frozen γ, raw α"),
    (dict(credit="delta", delta_select="top", delta_assignment="hard"), "delta Q2: top 50%, hard assignment"),
    (dict(credit="delta", loss_type="sapo"), "sapo + delta"),
    (dict(credit="fipo", entropy_top_ratio=0.2), "forking tokens ρ=0.2 + fipo"),
    (dict(fipo=True, entropy_top_ratio=0.2), "forking tokens ρ=0.2 + fipo"),
    (dict(loss_type="sapo", top_entropy_quantile=0.5), "sapo + forking tokens (TRL) ρ=0.5"),
    (dict(credit="cscr", cscr_weight="upweight", cscr_scope="group"), "cscr: up-weighting, group scope"),
    # settings that do not change the rule
    (dict(credit="delta", delta_impl="memory_efficient"), "delta"),
    (dict(loss_type="dr_grpo"), "grpo"),
    (dict(credit="cscr", cscr_threshold=0.5), "cscr"),
    (dict(credit="cscr", cscr_alpha=2.0), "cscr: α=2"),
]


@pytest.mark.parametrize("flags,name", RULE_NAMES)
def test_rule_name_of_every_rule(flags, name):
    assert report.rule_name(_config(**flags)) == name


def test_every_row_of_reproduce_has_its_own_name():
    """tools/bench/reproduce.py's RULES, each row's flags through python -m comparisons' parser (grpo.py's flags and
    the comparisons'): the rows get distinct names, DAPO's (no flags) is "grpo", and each name is the one RULE_NAMES
    lists for the same settings where it lists them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "bench"))  # (the script's own path)
    try:
        from reproduce import RULES
    finally:
        sys.path.pop(0)

    config = comparisons.config_class()
    parser = grpo_config.build_parser(config)
    names = {
        row: report.rule_name(dataclasses.asdict(config(**vars(parser.parse_args(f))))) for row, _, f, _, _ in RULES
    }
    assert len(set(names.values())) == len(RULES)
    assert names["dapo"] == "grpo" and names["fipo"] == "fipo" and names["dapo_ft_trl"] == "forking tokens (TRL) ρ=0.2"
    assert names["topk_proxy"] == "delta: top-K proxy K=20" and names["q2_bottom"] == "delta Q2: bottom 50%"
    assert names["lam_0.8_1.5"] == "delta: λ∈[0.8, 1.5]" and names["cscr_sign_aware"] == "cscr: sign-aware"


# The keys config.json gained with the comparison rules (and --fipo, the new spelling of --credit fipo): a run written
# before them has none of them, nor has a run of grpo.py (its GRPOConfig has none of the comparisons' flags).
NEW_KEYS = (
    "delta_scores",
    "delta_assignment",
    "delta_gamma",
    "delta_coefficients",
    "delta_normalize",
    "delta_proxy",
    "delta_proxy_topk",
    "delta_select",
    "delta_select_fraction",
    "cscr_scope",
    "cscr_sign_eps",
    "cscr_sign_mix",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "sapo_aggregation",
    "entropy_top_ratio",
    "top_entropy_quantile",
    "entropy_pool",
    "fipo_decay_rate",
    "fipo_clip",
    "fipo_safety_threshold",
    "fipo",
)


@pytest.mark.parametrize("credit", ["grpo", "delta", "cscr"])
def test_rule_name_of_an_older_config_is_its_credit(credit):
    old = {k: v for k, v in _config(credit=credit).items() if k not in NEW_KEYS}
    assert set(NEW_KEYS) <= set(_config()) and "credit" in old and "delta_k" in old
    assert report.rule_name(old) == credit
    assert report.symbol(old, credit) == report.SYMBOL[credit]
    assert report.rule_name({}) == "" and report.Run("x", "x", credit, {}, {}, [], {}).rule == credit


def test_symbol_of_each_rule():
    """The hovered name of the credit: f for FIPO, λ̄ / w̃ for DelTA / CSCR, c where the loss masks tokens out."""
    cases = [
        (dict(credit="fipo"), "f"),
        (dict(fipo=True), "f"),
        (dict(credit="delta"), "λ̄"),
        (dict(credit="cscr"), "w̃"),
        (dict(), "c"),
        (dict(loss_type="sapo"), "c"),
        (dict(entropy_top_ratio=0.2), "c"),
        (dict(credit="fipo", top_entropy_quantile=0.2), "c"),
        (dict(credit="delta", delta_select="top"), "c"),
        (dict(credit="delta", delta_gamma="frozen"), "λ̄"),
    ]
    for flags, sym in cases:
        cfg = _config(**flags)
        assert report.symbol(cfg, report.credit_of(cfg)) == sym, flags


def test_report_names_each_run_by_its_rule(tmp_path):
    """Runs named otherwise than their rules: the run table, the histograms' captions, the hover symbol, the rows of
    "Where the credit lands" and report.json's records give the rule; a Q2 run's 0/1 credit is not DelTA's λ̄."""
    steps = _toy_steps()
    rules = {
        "run_f": dict(fipo=True),
        "run_f_old": dict(credit="fipo"),  # --fipo's old spelling: the same name
        "run_ft": dict(entropy_top_ratio=0.2),
        "run_q2": dict(credit="delta", delta_select="top"),
        "run_d": dict(credit="delta", delta_gamma="frozen"),
    }
    paths = []
    for name, flags in rules.items():
        path = _write_run(tmp_path / name, flags.get("credit", "grpo"), [1, 2], lambda s: steps[s])
        (Path(path) / "config.json").write_text(json.dumps({"config": _config(**flags, data="toy")}))
        paths.append(path)
    out = tmp_path / "report.html"
    report.main([*paths, "--output", str(out)])
    text, numbers = out.read_text(), json.loads((tmp_path / "report.json").read_text())
    page = Page(text)
    expect = {
        "run_f": ("fipo", "f"),
        "run_f_old": ("fipo", "f"),
        "run_ft": ("forking tokens ρ=0.2", "c"),
        "run_q2": ("delta Q2: top 50%", "c"),
        "run_d": ("delta: frozen γ", "λ̄"),
    }
    for name, (rule, sym) in expect.items():
        assert f"</b></td><td>{rule}</td>" in text  # the run table's rule column
        assert f"{name} <small>{rule} · {sym} · " in text  # the histogram's caption
        assert f'<b>{name}</b> <small class="muted">{rule}</small></td>' in text  # "Where the credit lands"
        assert {t["title"].split("=")[0] for t in page.tokens if t["run"] == name} == {sym}
        assert name in numbers["where_the_credit_lands"]
    # DelTA's token view for the runs whose credit is λ̄ (Q2's: of the tokens its mask keeps)
    assert set(numbers["delta_tokens"]) == {"run_d", "run_q2"}
    assert "<b>FIPO</b>" in text and "<b>Masked rules</b>" in text  # the legend explains both


# ------------------------------------------------------------------------------------------------ real toy runs
@pytest.fixture(scope="module")
def toy_runs(toy_model_path, tmp_path_factory):
    """Three short toy runs (grpo, delta, cscr), same seed: the same prompts at the same steps."""
    root = tmp_path_factory.mktemp("toy_runs")
    for credit in ("grpo", "delta", "cscr"):
        grpo.main(
            [
                "--model",
                toy_model_path,
                "--prompt_template",
                "none",
                "--credit",
                credit,
                "--max_steps",
                "2",
                "--num_prompts_per_step",
                "4",
                "--num_generations",
                "4",
                "--eval_num_generations",
                "0",
                "--num_samples_to_log",
                "2",
                "--output_dir",
                str(root / credit),
                "--save_steps",
                "0",
            ]
        )
    return [str(root / c) for c in ("grpo", "delta", "cscr")]


def _samples(run):
    return [json.loads(l) for f in sorted(Path(run, "samples").glob("*.jsonl")) for l in f.read_text().splitlines()]


def test_trainer_logs_each_credit_per_token(toy_runs):
    """What grpo.py writes for the report: every response's tokens and credit, for every credit rule."""
    by_credit = dict(zip(("grpo", "delta", "cscr"), map(_samples, toy_runs)))
    for credit, rows in by_credit.items():
        assert len(rows) == 2 * 2 * 4  # 2 steps × num_samples_to_log 2 groups × G 4
        for r in rows:
            assert len(r["tokens"]) == len(r["credit"]) > 0
            assert "".join(r["tokens"]).replace("</s>", "") == r["response"]
    assert all(c == 1.0 for r in by_credit["grpo"] for c in r["credit"])
    live = [r for r in by_credit["delta"] if r["advantage"]]
    assert live
    for r in live:  # Â·λ̄ / Â = λ̄: the credit is λ̄, token by token
        assert r["lam_bar"] == pytest.approx(r["credit"], abs=2e-4)
        assert r["token_advantages"] == pytest.approx([r["advantage"] * c for c in r["credit"]], abs=1e-3)
    cscr_live = [r for r in by_credit["cscr"] if r["advantage"]]
    assert cscr_live
    for r in cscr_live:  # CSCR keeps each response's credit budget: Σ_t w̃_t = L_i
        assert sum(r["credit"]) == pytest.approx(len(r["credit"]), abs=1e-3 * len(r["credit"]))
    prompts = [[r["prompt"] for r in rows] for rows in by_credit.values()]
    assert prompts[0] == prompts[1] == prompts[2]  # same seed: the same prompts, matched across runs


def test_report_of_toy_runs(toy_runs, tmp_path):
    out = tmp_path / "toy.html"
    report.main([*toy_runs, "--output", str(out)])
    page = Page(out.read_text())
    n_tokens = sum(len(r["tokens"]) for run in toy_runs for r in _samples(run))
    assert len(page.tokens) == n_tokens and page.table_runs == ["grpo", "delta", "cscr"]
    assert set(page.columns) == {"grpo", "delta", "cscr"} and len(page.columns) == 3 * 2 * 2  # 2 prompts × 2 steps
    _check_where_the_credit_lands(toy_runs, out.read_text(), page, tmp_path / "toy.json")


def _check_where_the_credit_lands(toy_runs, text, page, numbers_file):
    """Real toy runs: the section with a row per run, GRPO's numbers exactly 1 and 0.5, every incorrect response's
    first wrong token marked, the numbers in <page>.json."""
    import toy

    lands = json.loads(numbers_file.read_text())["where_the_credit_lands"]
    assert list(lands) == ["grpo", "delta", "cscr"]
    assert all(v["mean"] in (1.0, None) for v in lands["grpo"]["classes"].values())
    assert all(v["mean"] in (0.5, None) for v in lands["grpo"]["auroc"].values())
    assert sum(v["count"] for v in lands["grpo"]["classes"].values()) > 0
    section = text[text.index('id="where-the-credit-lands"') : text.index('id="delta-tokens"')]
    assert section.count("<tr>") == 1 + 3 and "DelTA's tokens" in text
    wrong = {
        run: [
            r["tokens"][k]
            for r in _samples(path)
            if r["reward"] <= 0
            for k in [toy.first_wrong_token(r["prompt"], r["tokens"])]
            if k is not None
        ]
        for run, path in zip(("grpo", "delta", "cscr"), toy_runs)
    }
    for run, toks in wrong.items():
        marked = [t["text"] for t in page.tokens if t["run"] == run and "fw" in t["class"].split()]
        assert sorted(marked) == sorted(report._token_text(t) for t in toks)


# ------------------------------------------------------------------------------------------------ --report_to
def _fake_tracker(name, calls):
    """A module with wandb's and trackio's API (init -> run with log(values, step=), finish) recording calls."""
    mod = types.ModuleType(name)

    class FakeRun:
        def log(self, values, step=None):
            calls.append(("log", step, dict(values)))

        def finish(self):
            calls.append(("finish",))

    def init(project=None, name=None, config=None):
        calls.append(("init", project, name, config))
        return FakeRun()

    mod.init = init
    return mod


@pytest.mark.parametrize("backend", ["wandb", "trackio"])
def test_report_to_sends_every_metric_line(tiny_model_path, tmp_path, monkeypatch, backend):
    """grpo.py --report_to wandb|trackio: init with the flags, every metrics.jsonl line (no step key, no null)
    at its step, finish at the end; the module is only imported when asked for."""
    calls = []
    monkeypatch.setitem(sys.modules, backend, _fake_tracker(backend, calls))
    monkeypatch.delenv(f"{backend.upper()}_PROJECT", raising=False)
    out = tmp_path / "run"
    grpo.main(
        [
            "--model",
            tiny_model_path,
            "--output_dir",
            str(out),
            "--prompt_template",
            "none",
            "--max_steps",
            "2",
            "--num_prompts_per_step",
            "2",
            "--num_generations",
            "2",
            "--max_completion_length",
            "8",
            "--eval_num_generations",
            "0",
            "--save_steps",
            "0",
            "--report_to",
            f"none,{backend}",
        ]
    )
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert calls[0][:3] == ("init", "rlvr-credit", "run") and calls[0][3]["report_to"] == f"none,{backend}"
    assert calls[-1] == ("finish",)
    logged = [c for c in calls if c[0] == "log"]
    assert [c[1] for c in logged] == [l["step"] for l in lines] == [1, 2]
    for (_, _, values), line in zip(logged, lines):
        assert values == {k: v for k, v in line.items() if k != "step" and v is not None}


def test_report_to_tensorboard_writes_events_tensorboard_reads(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard backend needs `pip install tensorboard`")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = checkpoint.RunFolder(str(tmp_path / "run"), {"report_to": "tensorboard"})
    run.start(torch.nn.Linear(2, 2), {"prompt_template": "none"})
    records = [
        {"step": 0, "eval/avg@8": 0.25},
        {"step": 1, "reward": 0.5, "delta/lam_pos_max": 1.2, "nan": math.nan},
        {"step": 2, "reward": 0.75, "delta/lam_pos_max": 1.1},
    ]
    for r in records:
        run_setup.log_record(run, r)
    run.close()
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["delta/lam_pos_max", "eval/avg@8", "reward"]
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 0.5), (2, 0.75)]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("delta/lam_pos_max")] == [(1, 1.2), (2, 1.1)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/avg@8")] == [(0, 0.25)]


def test_report_to_tensorboard_on_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    """--resume from checkpoint-1 logs steps 2 and 3 again: TensorBoard, like metrics.jsonl, keeps only the new
    ones (purge_step)."""
    pytest.importorskip("tensorboard", reason="the tensorboard backend needs `pip install tensorboard`")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, config = tmp_path / "run", {"report_to": "tensorboard"}
    run = checkpoint.RunFolder(str(path), config)
    run.start(torch.nn.Linear(2, 2), {"prompt_template": "none"})
    for step in (1, 2, 3):
        run_setup.log_record(run, {"step": step, "reward": step / 10})
    run.close()
    (path / "checkpoint-1").mkdir()  # as if the run had saved after step 1 (1 metrics line) and then crashed
    (path / "checkpoint-1" / checkpoint.TRAINER_STATE).write_text(
        json.dumps({"step": 1, "metrics_lines": 1, "skipped_updates_total": 0})
    )
    run = checkpoint.RunFolder(str(path), {**config, "resume": True})
    run.start(torch.nn.Linear(2, 2), {"prompt_template": "none"})
    for step in (2, 3):
        run_setup.log_record(run, {"step": step, "reward": step})
    run.close()
    acc = EventAccumulator(str(path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, pytest.approx(0.1)), (2, 2.0), (3, 3.0)]
    assert [json.loads(l)["reward"] for l in (path / "metrics.jsonl").read_text().splitlines()] == [0.1, 2, 3]


def test_report_to_errors_before_the_model_loads(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed: import raises ImportError
    with pytest.raises(
        SystemExit,
        match=r"^grpo.py: error: --report_to wandb needs the wandb package: pip install "
        r"wandb$",
    ):
        grpo.main(["--model", "no-such-model", "--report_to", "wandb", "--output_dir", "/nonexistent/x"])
    with pytest.raises(
        SystemExit,
        match=r"--report_to mlflow: unknown tracker 'mlflow'; choose none, or any of "
        r"tensorboard, wandb, trackio",
    ):
        grpo.main(["--model", "no-such-model", "--report_to", "mlflow", "--output_dir", "/nonexistent/x"])


# ------------------------------------------------------------------------------------------------ in a browser
@pytest.fixture(scope="module")
def chromium():
    """Chromium's executable; the test skips (before the toy runs are made) when there is none."""
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium)")
    return exe


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.browser
def test_report_renders_in_headless_chromium(chromium, toy_runs, tmp_path):
    """The page of three toy runs (grpo, delta, cscr) as Chromium renders it: every run, every token span with
    its value, "Where the credit lands" with its numbers and marks, and a screenshot."""
    out = tmp_path / "report.html"
    report.main([*toy_runs, "--output", str(out)])
    flags = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    page = Page(dom)
    assert "</html>" in dom and page.table_runs == ["grpo", "delta", "cscr"]
    assert set(page.columns) == {"grpo", "delta", "cscr"}
    samples = {run: _samples(p) for run, p in zip(("grpo", "delta", "cscr"), toy_runs)}
    for run, rows in samples.items():
        toks = [t for t in page.tokens if t["run"] == run]
        assert len(toks) == sum(len(r["tokens"]) for r in rows)
        assert [float(t["title"].split("=")[-1]) for t in toks[: len(rows[0]["credit"])]] == pytest.approx(
            sorted(rows[:4], key=lambda r: -r["advantage"])[0]["credit"], abs=1e-4
        )
    _check_where_the_credit_lands(toy_runs, dom, page, tmp_path / "report.json")  # the section, as Chromium sees it
    shot = tmp_path / "report.png"
    subprocess.run(
        [*flags, "--hide-scrollbars", "--window-size=1400,1200", f"--screenshot={shot}", out.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_tick_labels_of_a_narrow_range_are_distinct():
    """A curve between 0.9962 and 0.9983: three significant digits labelled two ticks 0.997; each label now writes
    its tick exactly. Wide ranges keep their short labels, and large ones no exponent."""
    svg = report.line_chart([{"colour": "#000", "label": "reward", "points": [(1, 0.9962), (2, 0.9983), (3, 0.997)]}])
    labels = re.findall(r'class="yl">([^<]*)<', svg)
    assert len(labels) >= 3 and len(set(labels)) == len(labels)
    assert all("e" not in label for label in labels)
    for ticks, labels in (
        ([0.9965, 0.997, 0.9975, 0.998], ["0.9965", "0.997", "0.9975", "0.998"]),
        ([0.0, 0.25, 0.5, 0.75, 1.0], ["0", "0.25", "0.5", "0.75", "1"]),
        ([200, 400, 600, 800, 1000], ["200", "400", "600", "800", "1000"]),
        ([100.2, 100.4, 100.6], ["100.2", "100.4", "100.6"]),
        ([1e-05, 1.5e-05, 2e-05], ["1e-05", "1.5e-05", "2e-05"]),
    ):
        assert report._tick_labels(ticks) == labels
