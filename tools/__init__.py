"""Tools beside the trainer, run as scripts: report.py (a run folder's page), cscr_diagnostics.py (CSCR's
sensitivity on saved samples), bench/ (benchmarks and the reproduce tool), examples/ (delta.py and cscr.py inside TRL
and verl) and their extra requirements (requirements-*.txt). They import the project; nothing imports them but other
tools and the tests (one arrow left: trainer/run_setup.py writes a run's samples/summary.json with report.py;
docs/layout.md)."""
