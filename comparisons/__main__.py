"""``python -m comparisons``: grpo.py's trainer with the papers' comparisons (comparisons/__init__.py's ``main``)."""

import signal

import comparisons

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt, run_command's line
    comparisons.main()
