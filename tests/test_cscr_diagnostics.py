"""Tests for cscr_diagnostics.py: D1-D7 against the spec §8 toy numbers and independent formulas, the study (sampled,
cut and graded as the trainer's stages 1-2), the CLI."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_cscr import LP0, LP_NEG, LP_POS, naive_logprobs, random_batch, t  # noqa: E402

import cscr  # noqa: E402
import rollout  # noqa: E402
import verify  # noqa: E402
from tools import cscr_diagnostics  # noqa: E402
from trainer import policy  # noqa: E402


def test_diagnostics_toy_example():
    m = torch.ones(1, 8)
    masks = cscr_diagnostics.shift_masks(t(LP0), t(LP_POS), t(LP_NEG), m, tau=0.05)
    assert masks["affected"][0].nonzero().flatten().tolist() == [0, 1, 2, 5, 6, 7]
    assert masks["reversal"][0].nonzero().flatten().tolist() == [5]
    d = cscr_diagnostics.diagnostics(t(LP0), t(LP_POS), t(LP_NEG), m, torch.tensor([True]), tau=0.05, top_frac=3 / 8)
    assert d["d1_num_affected"] == 6
    assert abs(d["d1_same_direction_rate"] - 5 / 6) < 1e-12
    assert abs(d["d2_sign_reversal_rate"] - 1 / 6) < 1e-12
    assert abs(d["d4a_pearson"] - 0.989264) < 1e-6
    assert d["d4b_k"] == 3 and d["d4b_topk_jaccard"] == 1.0
    assert abs(d["d5_common_mode_share"] - 0.983364) < 1e-6
    # D3 by hand: D+ - D- on affected tokens = [.3, .05, .15, .2, .02, .1] -> all > 0 -> 1.0 when correct
    assert d["d3_polarity_outcome_consistency"] == 1.0
    d_inc = cscr_diagnostics.diagnostics(t(LP0), t(LP_POS), t(LP_NEG), m, torch.tensor([False]), tau=0.05)
    assert d_inc["d3_polarity_outcome_consistency"] == 0.0


def test_topk_jaccard_partial_overlap():
    # D+ = [3, 2, .1, .05], D- = [.1, 2, 3, .05] -> top-2 sets {0,1} and {1,2} -> Jaccard 1/3
    old_logp = torch.zeros(1, 4, dtype=torch.float64)
    lp_pos, lp_neg = torch.tensor([[3.0, 2.0, 0.1, 0.05]]), torch.tensor([[0.1, 2.0, 3.0, 0.05]])
    d = cscr_diagnostics.diagnostics(old_logp, lp_pos, lp_neg, torch.ones(1, 4), torch.tensor([True]), top_k=2)
    assert d["d4b_k"] == 2 and abs(d["d4b_topk_jaccard"] - 1 / 3) < 1e-12
    # top_frac: ceil(0.5 * 4) = 2 gives the same sets
    d2 = cscr_diagnostics.diagnostics(old_logp, lp_pos, lp_neg, torch.ones(1, 4), torch.tensor([True]), top_frac=0.5)
    assert d2["d4b_k"] == 2 and abs(d2["d4b_topk_jaccard"] - 1 / 3) < 1e-12


def test_spearman_and_pearson_independent():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(50, generator=g, dtype=torch.float64)
    y = x + 0.5 * torch.randn(50, generator=g, dtype=torch.float64)
    xm, ym = x - x.mean(), y - y.mean()
    assert abs(cscr_diagnostics.pearson(x, y) - float((xm @ ym) / (xm.norm() * ym.norm()))) < 1e-12
    # Spearman without ties = 1 - 6 sum d^2 / (n (n^2 - 1))
    rx = x.argsort().argsort().double()
    ry = y.argsort().argsort().double()
    n = 50
    assert abs(cscr_diagnostics.spearman(x, y) - (1 - 6 * ((rx - ry) ** 2).sum().item() / (n * (n * n - 1)))) < 1e-12
    # ties get average ranks: x = [1,1,2,3] -> ranks [1.5,1.5,3,4], y = [1,3,2,4] -> [1,3,2,4];
    # by hand: centred [-1,-1,.5,1.5] and [-1.5,.5,-.5,1.5], cov 3, norms^2 4.5 and 5 -> 3/sqrt(22.5)
    a = torch.tensor([1.0, 1.0, 2.0, 3.0])
    b = torch.tensor([1.0, 3.0, 2.0, 4.0])
    assert abs(cscr_diagnostics.spearman(a, b) - 3 / math.sqrt(22.5)) < 1e-12
    assert math.isnan(cscr_diagnostics.pearson(torch.ones(4), torch.arange(4.0)))


def test_full_vocab_overlap_toy():
    p0 = torch.tensor([0.5, 0.2, 0.2, 0.1])
    pp = torch.tensor([0.7, 0.1, 0.15, 0.05])
    pn = torch.tensor([0.65, 0.15, 0.10, 0.10])
    o = cscr_diagnostics.full_vocab_overlap(p0, pp, pn)
    assert abs(o["cosine"].item() - 0.911685) < 1e-6
    assert abs(o["kl_pos"].item() - 0.088406) < 1e-6
    assert abs(o["kl_neg"].item() - 0.058070) < 1e-6
    # batched positions and a zero-probability entry (0 log 0 = 0)
    P0 = torch.stack([p0, torch.tensor([0.5, 0.5, 0.0, 0.0])])
    Pp = torch.stack([pp, torch.tensor([0.25, 0.75, 0.0, 0.0])])
    Pn = torch.stack([pn, torch.tensor([0.75, 0.25, 0.0, 0.0])])
    o2 = cscr_diagnostics.full_vocab_overlap(P0, Pp, Pn)
    assert o2["cosine"].shape == (2,)
    assert abs(o2["cosine"][1].item() + 1.0) < 1e-6  # g+ = -g-
    assert abs(o2["kl_pos"][1].item() - (0.25 * math.log(0.5) + 0.75 * math.log(1.5))) < 1e-6
    # sampled token 0 (spec §8): D+ = log(.7/.5), D- = log(.65/.5)
    assert abs(math.log(0.7 / 0.5) - 0.336472) < 1e-6 and abs(math.log(0.65 / 0.5) - 0.262364) < 1e-6


def test_classify_token():
    for s in ["Wait", " So", " Let", " Therefore", "Hmm", ",", ".", "\n\n", " ", "**", "$", " the", "\\boxed{"]:
        assert cscr_diagnostics.classify_token(s) == "surface", s
    for s in [" 3", "42", " +", " =", " x", "\\frac", " triangle", "^", " -"]:
        assert cscr_diagnostics.classify_token(s) == "content", s


def test_diagnostics_d6_d7():
    _, old_logp, lp_pos, lp_neg, m = random_batch(B=6, T=20, seed=7)
    s = cscr.sensitivity(old_logp, lp_pos, lp_neg, m)
    surf = s > cscr.calibrate_threshold(s, m, 0.5)  # surface = the more sensitive half (by construction)
    ent = s * 2.0 + 1.0  # perfectly correlated
    top1 = 1.0 - s  # 1 - top1 = s
    d = cscr_diagnostics.diagnostics(
        old_logp,
        lp_pos,
        lp_neg,
        m,
        torch.ones(6, dtype=torch.bool),
        token_classes=surf,
        entropy=ent,
        top1_prob=top1,
        sens_top_frac=0.1,
    )
    assert d["d6_surface_share_top"] == 1.0
    assert abs(d["d6_surface_share_all"] - surf[m].double().mean().item()) < 1e-12
    assert abs(d["d6_s_mean_surface"] - s[m & surf].mean().item()) < 1e-9
    assert abs(d["d6_s_mean_content"] - s[m & ~surf].mean().item()) < 1e-9
    assert abs(d["d7_pearson_s_entropy"] - 1.0) < 1e-9 and abs(d["d7_spearman_s_1_minus_top1"] - 1.0) < 1e-9
    # list-of-strings form gives the same profile
    classes = [["surface" if surf[i, j] else "content" for j in range(int(m[i].sum()))] for i in range(6)]
    d2 = cscr_diagnostics.diagnostics(
        old_logp, lp_pos, lp_neg, m, torch.ones(6, dtype=torch.bool), token_classes=classes, sens_top_frac=0.1
    )
    assert d2["d6_surface_share_top"] == d["d6_surface_share_top"]
    assert d2["d6_s_mean_surface"] == d["d6_s_mean_surface"]


def test_diagnose_smoke(tiny, tmp_path):
    model, tok = tiny
    problems = ["Compute 1+2.", "Compute 3+4.", "Compute 10-5."]
    answers = ["3", "7", "5"]
    rep, ten = cscr_diagnostics.diagnose(
        model,
        tok,
        problems,
        answers,
        5,
        max_new_tokens=6,
        micro_batch_size=2,
        gen_batch_size=3,
        output_dir=str(tmp_path),
        template="answer",
        temperature=0.9,
        return_tensors=True,
    )
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["num_correct"] == rep["num_correct"]
    d = rep["diagnostics"]
    mask = ten["response_mask"]
    assert rep["config"]["num_trajectories"] == 5 and mask.shape[0] == 5
    assert d["num_valid_tokens"] == int(mask.sum()) and 1 <= mask.sum(1).min() and mask.sum(1).max() <= 6
    for k in ("d4a_pearson", "d4b_topk_jaccard", "d5_common_mode_share", "d4c_cosine_mean", "d6_surface_share_all"):
        assert d[k] is None or -1.0 - 1e-9 <= d[k] <= 1.0 + 1e-9, k
    if d["d1_same_direction_rate"] is not None:
        assert abs(d["d1_same_direction_rate"] + d["d2_sign_reversal_rate"] - 1.0) < 1e-12
    assert d["d4c_kl_pos_mean"] >= 0 and d["d4c_kl_neg_mean"] >= 0
    assert " is not the correct final answer." in rep["example_condition_prompts"][1]
    assert len(rep["most_sensitive_tokens"]) == min(20, d["num_valid_tokens"])
    # the three passes agree with condition_logprobs and with an unpadded per-sequence computation
    lp_pos, lp_neg = cscr.condition_logprobs(
        model, tok, list(zip(ten["prompts_pos"], ten["prompts_neg"])), ten["response_ids"], mask, temperature=0.9
    )
    assert torch.allclose(lp_pos, ten["lp_pos"], atol=1e-5) and torch.allclose(lp_neg, ten["lp_neg"], atol=1e-5)
    n0 = int(mask[0].sum())
    r0 = ten["response_ids"][0, :n0].tolist()
    assert torch.allclose(
        ten["old_logp"][0, :n0].double(), naive_logprobs(model, tok, ten["prompts"][0], r0, 0.9), atol=2e-5
    )

    # D4c at one position against an independent recomputation
    def dist(prompt):
        p = tok(prompt)["input_ids"]
        with torch.no_grad():
            return torch.softmax(model(input_ids=torch.tensor([p + r0])).logits[0, len(p) - 1].double() / 0.9, -1)

    o = cscr_diagnostics.full_vocab_overlap(*(dist(ten[k][0]) for k in ("prompts", "prompts_pos", "prompts_neg")))
    assert abs(o["cosine"].item() - ten["fv_cosine"][0, 0].item()) < 1e-4
    assert abs(o["kl_pos"].item() - ten["fv_kl_pos"][0, 0].item()) < 1e-5
    p0 = dist(ten["prompts"][0])
    assert abs(ten["entropy"][0, 0].item() + (p0 * p0.log()).sum().item()) < 1e-5
    assert abs(ten["top1_prob"][0, 0].item() - p0.max().item()) < 1e-6


@pytest.mark.parametrize(
    "template,expected",
    [
        ("verdict", "verdict"),
        ("C", "answer"),
        (("ok {reference}", "not ok {reference}"), ["ok {reference}", "not ok {reference}"]),
    ],
)
def test_report_config_names_the_template_used(tiny, tmp_path, template, expected):
    # bug: the config's "template" was a loop variable reused later ("d4c_kl_neg_mean"), not the template used
    model, tok = tiny
    rep = cscr_diagnostics.diagnose(
        model, tok, ["Compute 1+2."], ["3"], 2, max_new_tokens=3, template=template, output_dir=str(tmp_path)
    )
    assert rep["config"]["template"] == expected
    assert json.loads((tmp_path / "report.json").read_text())["config"]["template"] == expected


def test_cli_writes_report(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "diag"
    rep = cscr_diagnostics.main(
        [
            "--model",
            str(tiny_model_path),
            "--data",
            "toy",
            "--num_trajectories",
            "4",
            "--max_new_tokens",
            "4",
            "--prompt_template",
            "none",
            "--template",
            "reference",
            "--output_dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert cscr_diagnostics.summary_table(rep) in printed and "{" not in printed  # a table, not a dict
    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps(rep))
    assert saved["config"]["template"] == "reference" and saved["config"]["num_trajectories"] == 4
    assert "Correct final answer:" in saved["example_condition_prompts"][0]
    assert saved["diagnostics"]["num_valid_tokens"] >= 4


def test_diagnose_samples_as_the_trainer(tiny):
    # the study's responses are the trainer's stage 1 (rollout.sample with the template's stop ids and strings,
    # one generate call for the whole batch) token for token: same seed, same prompts -> the same ids, mask, text
    model, tok = tiny
    _, ten = cscr_diagnostics.diagnose(
        model,
        tok,
        ["compute one plus two.", "compute ten."],
        ["3", "10"],
        4,
        max_new_tokens=8,
        gen_batch_size=4,
        seed=3,
        temperature=0.9,
        top_p=0.95,
        return_tensors=True,
    )
    batch = rollout.sample(
        model,
        tok,
        ten["prompts"],
        1,
        rollout.SamplingSettings(
            8,
            0.9,
            0.95,
            seed=3,
            stop_ids=rollout.stop_token_ids(tok, "none", model),
            stop_strings=rollout.template_stop_strings("none"),
        ),
    )
    T = ten["response_mask"].shape[1]
    assert torch.equal(batch.response_mask.bool()[:, :T], ten["response_mask"])
    assert not batch.response_mask[:, T:].any()  # the study drops only columns that hold no response token
    assert torch.equal(batch.response_ids[:, :T], ten["response_ids"])
    assert batch.texts == ten["texts"]


def _scripted_generate(tok, responses):
    """A stand-in for ``model.generate`` that "samples" ``responses[i]`` + EOS for row i: the test then knows what
    stage 1 must cut and stage 2 must grade (the scoring passes still run the real model)."""

    def generate(input_ids, attention_mask, generation_config, **kwargs):
        rows = [
            tok(responses[i], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for i in range(len(input_ids))
        ]
        out = torch.full((len(rows), max(map(len, rows))), generation_config.pad_token_id, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return torch.cat([input_ids, out], 1)

    return generate


# one problem "Compute 1+2." (reference 3) and four responses whose grading the trainer's verifier decides:
SCRIPTED = [
    "1+2=4. \\boxed{4} Oh no, 1+2=3",  # boxed answer wrong, last number right: incorrect (no last-number fallback)
    "1+2=3. \\boxed{3}",  # correct
    "1+2=3",  # no box: incorrect, and template C's answer is "" (not the last number 3)
    "1+2=3. \\boxed{3}\n\nQuestion: 1+1? \\boxed{5}",  # the "none" template's stop string ends it after "Question:"
]


@pytest.fixture
def scripted(tiny_model_path, monkeypatch):
    """The tiny toy-tokenizer model (printable ASCII, so \\boxed and "Question:" tokenise) answering ``SCRIPTED``."""
    model, tok = policy.load_model_and_tokenizer(str(tiny_model_path), "float32", "cpu")
    monkeypatch.setattr(model, "generate", _scripted_generate(tok, SCRIPTED))
    return model, tok


def test_diagnose_grades_as_verify_grade_batch(scripted):
    model, tok = scripted
    rep, ten = cscr_diagnostics.diagnose(
        model, tok, ["Compute 1+2."], ["3"], len(SCRIPTED), template="answer", max_new_tokens=64, return_tensors=True
    )
    graded = verify.grade_batch(ten["texts"], ten["references"])
    assert ten["correct"].tolist() == [ok for ok, _ in graded]
    assert ten["correct"].tolist() == [False, True, False, True]
    assert rep["num_correct"] == 2 and rep["grader"] == verify.summarize(graded)
    # template C's answer: verify.extract_boxed of the response, "" without a box (credit_methods.CscrCredit)
    for i, text in enumerate(ten["texts"]):
        expected = cscr.build_condition_prompts(
            ten["prompts"][i], reference="3", response_answer=verify.extract_boxed(text) or "", template="answer"
        )
        assert (ten["prompts_pos"][i], ten["prompts_neg"][i]) == expected
    assert "Verdict: 4 is the correct final answer." in ten["prompts_pos"][0]
    assert "Verdict:  is the correct final answer." in ten["prompts_pos"][2]  # not the last number "3"


def test_diagnose_cuts_at_template_stop_strings(scripted):
    model, tok = scripted
    _, ten = cscr_diagnostics.diagnose(
        model, tok, ["Compute 1+2."], ["3"], len(SCRIPTED), max_new_tokens=64, return_tensors=True
    )
    # the whole response (and its EOS) for rows without a stop string; row 3 up to the character completing
    # "\n\nQuestion:" (one token per character), as rollout.sample cuts it in training
    cut = SCRIPTED[3][: SCRIPTED[3].index("\n\nQuestion:") + len("\n\nQuestion:")]
    assert ten["texts"] == SCRIPTED[:3] + [cut]
    lengths = [len(r) + 1 for r in SCRIPTED[:3]] + [len(cut)]
    assert ten["response_mask"].sum(1).tolist() == lengths
    assert tok.decode(ten["response_ids"][3, : len(cut)].tolist()) == cut
    assert ten["response_mask"].shape[1] == max(lengths)  # nothing scored past the cut
    # graded on the cut text: the box after the stop string (5) would make it wrong
    assert bool(ten["correct"][3]) and not verify.verify(SCRIPTED[3], "3")


def test_the_printed_table_has_d1_to_d7_beside_the_papers_values():
    d = {
        "num_valid_tokens": 100,
        "d1_num_affected": 40,
        "d1_same_direction_rate": 0.9375,
        "d2_sign_reversal_rate": 0.0625,
        "d3_polarity_outcome_consistency": 0.5,
        "d4a_pearson": 0.8,
        "d4a_spearman": 0.7,
        "d4b_topk_jaccard": 0.25,
        "d4c_cosine_mean": 0.9,
        "d5_common_mode_share": 0.95,
        "d6_s_mean_surface": 1.5,
        "d6_s_mean_content": 0.25,
        "d6_surface_share_top": 1.0,
        "d6_surface_share_all": 0.4,
        "d7_pearson_s_entropy": 0.5,
        "d7_spearman_s_entropy": 0.6,
        "d7_pearson_s_1_minus_top1": None,
        "d7_spearman_s_1_minus_top1": None,
    }  # None: nan in report.json
    table = cscr_diagnostics.summary_table(
        {"diagnostics": d, "accuracy": 0.25, "config": {"num_trajectories": 8, "tau": 0.05}}
    )
    lines = table.splitlines()
    assert lines[0] == (
        "CSCR diagnostics: 8 trajectories (accuracy 0.250), 40 of 100 tokens affected (|d+| and "
        "|d-| > 0.05 nats); the paper: 400 on-policy trajectories, each re-scored under both "
        "conditions"
    )  # (what the paper's 400 counts)
    row = {line.split()[0]: line for line in lines[2:] if line[:1].strip()}
    assert sorted(row) == ["D1", "D2", "D3", "D4a", "D4b", "D4c", "D5", "D6", "D7"]
    assert "93.8%" in row["D1"] and "91.4-95.8%" in row["D1"]
    assert "6.2%" in row["D2"] and "4.2-8.6%" in row["D2"]  # the paper's D2: 1 - D1
    assert "50.0%" in row["D3"] and "about 58%" in row["D3"]
    assert "0.800 / 0.700" in row["D4a"] and "1.500 / 0.250" in row["D6"] and "0.500 / 0.600" in row["D7"]
    assert "n/a / n/a" in lines[-1]
