"""Tools beside the trainer, run as scripts: report.py (a run folder's page), cscr_diagnostics.py (CSCR's
sensitivity on saved samples), bench/ (benchmarks and the reproduce tool), examples/ (delta.py and cscr.py inside TRL
and verl) and their extra requirements (requirements-*.txt). They import the project; nothing imports them but other
tools and the tests (docs/layout.md)."""
