"""Record cscr.py's outputs (old keyword API, commit 71d7a89) on random inputs: tests/data/cscr_reference.pt."""
import math, sys
import torch
sys.path.insert(0, sys.argv[1])
import cscr

B, T = 8, 6
g = torch.Generator().manual_seed(39)
lengths = torch.tensor([6, 4, 6, 1, 5, 6, 3, 6])
mask = torch.arange(T)[None] < lengths[:, None]
lp0 = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
lp_pos = lp0 + torch.randn(B, T, generator=g, dtype=torch.float64)
lp_neg = lp0 + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
lp_pos[5] = lp0[5] - 40 - torch.rand(T, generator=g, dtype=torch.float64)  # every weight of row 5 underflows at alpha 30
lp0[~mask], lp_pos[~mask], lp_neg[~mask] = -math.inf, -math.inf, math.nan  # garbage on padding
adv = torch.randn(B, generator=g, dtype=torch.float64)
adv[2] = 0.0  # a row without credit
inputs = {"adv": adv, "old_logp": lp0, "lp_pos": lp_pos, "lp_neg": lp_neg, "mask": mask}

CASES = [("default", {}), ("threshold_0.5", {"threshold": 0.5}), ("alpha_0", {"alpha": 0.0}),
         ("alpha_3", {"alpha": 3.0}), ("alpha_30", {"alpha": 30.0}), ("floor", {"alpha": 4.0, "w_min": 0.1}),
         ("mean", {"mode": "mean"}), ("common", {"mode": "common"}), ("exp_abs", {"weight": "exp_abs", "alpha": 2.0}),
         ("inverse", {"weight": "inverse", "alpha": 2.0, "w_min": 0.3}), ("upweight", {"weight": "upweight"}),
         ("upweight_60", {"weight": "upweight", "alpha": 60.0, "w_min": 0.5}), ("sign_aware", {"weight": "sign_aware"}),
         ("sign_aware_args", {"weight": "sign_aware", "sign_eps": 0.1, "sign_mix": 0.3, "w_min": 0.95, "mode": "mean"}),
         ("group", {"scope": "group", "group_size": 4}), ("batch", {"scope": "batch"}),
         ("group_alpha_30", {"scope": "group", "group_size": 2, "alpha": 30.0}),
         ("upweight_group", {"weight": "upweight", "scope": "group", "group_size": 4}),
         ("sign_aware_batch", {"weight": "sign_aware", "scope": "batch"}),
         ("inverse_batch", {"weight": "inverse", "scope": "batch", "mode": "common", "threshold": 0.1})]
out = {"inputs": {}, "cases": CASES, "token_adv": {}, "stats": {}, "sensitivity": {}, "log_weights": {},
       "weights": {}, "threshold_q0.8": {}}
for name, dt in (("float32", torch.float32), ("float64", torch.float64)):
    x = {k: (v.to(dt) if v.is_floating_point() else v) for k, v in inputs.items()}
    out["inputs"][name] = x
    args = (x["adv"], x["old_logp"], x["lp_pos"], x["lp_neg"], x["mask"])
    advs, stats = [], []
    for case, kw in CASES:
        a, st = cscr.cscr_token_advantages(*args, return_stats=True, **kw)
        assert torch.equal(a, cscr.cscr_token_advantages(*args, **kw))
        advs.append(a)
        stats.append(st)
    out["token_adv"][name] = torch.stack(advs)
    out["stats"][name] = stats
    s = {m: cscr.sensitivity(*args[1:], mode=m) for m in ("max", "mean", "common")}
    out["sensitivity"][name] = torch.stack([s[m] for m in ("max", "mean", "common")])
    maps = [("exp", 1.0, 0.0), ("exp", 5.0, 0.5), ("exp_abs", 2.0, 0.0), ("inverse", 2.0, 0.0), ("upweight", 1.0, 0.0)]
    out["weight_cases"] = maps
    out["log_weights"][name] = torch.stack([cscr.credit_log_weights(s["max"], 0.2, al, wm, w) for w, al, wm in maps])
    out["weights"][name] = torch.stack([cscr.credit_weights(s["max"], x["mask"], 0.2, al, wm, w) for w, al, wm in maps])
    out["threshold_q0.8"][name] = cscr.calibrate_threshold(s["max"], x["mask"], 0.8)
torch.save(out, sys.argv[2])
print("cases", len(CASES))
