"""The papers' comparisons, beside the methods they are compared with: DelTA's baselines (SAPO, Forking Tokens,
FIPO; baselines.py and loss_rules.py), DelTA's ablations and Q2 (delta_ablations.py), CSCR's ablations
(cscr_ablations.py). Each is chosen once from its flag; delta.py and cscr.py name none of them. Imported by grpo.py
and trainer/run_setup.py (which choose them from the flags) and by the tests; they import the methods they replace
(delta, cscr) and trainer/ (the model's passes), never tools/ (docs/layout.md)."""
