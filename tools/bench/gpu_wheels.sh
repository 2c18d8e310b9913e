#!/usr/bin/env bash
# Prepare, here, what tools/bench/gpu_check.py needs on the device machine (one GPU, no network, no package index, its
# own python3 3.12 with torch, transformers, peft, numpy, sympy, tqdm, pytest; no math-verify, no pebble):
#
#   .whl/*.whl            the pure-Python packages the project needs that the device lacks, at requirements.txt's
#                         pins: math-verify 0.9.0 and its own dependencies latex2sympy2_extended 1.11.0 (pinned by
#                         math-verify) and antlr4-python3-runtime 4.13.2 (requirements.txt's pin;
#                         sympy is there), and pebble 5.2.3 (verify.py's grading workers). gpu_check.py installs
#                         them there with pip --no-index --no-deps --target and puts them first on PYTHONPATH.
#   .whl/git_state.json   the commit being checked (the device's copy of the tree has no .git)
#
# The toy model needs nothing: it ships in toy/model/ and travels with the tree. .whl is ignored by git, so the
# device call names it in `carry` (see tools/bench/gpu_check.py's header for the call). Run from anywhere:
#
#   bash tools/bench/gpu_wheels.sh
#   bash tools/bench/gpu_wheels.sh --with-peft   # also carry peft 0.21.2 (requirements.txt's pin) over the device's peft
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PINS=(math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 pebble==5.2.3)
if [[ "${1:-}" == "--with-peft" ]]; then PINS+=(peft==0.21.2); elif [[ -n "${1:-}" ]]; then
  echo "gpu_wheels.sh: unknown argument '$1' (only --with-peft)" >&2; exit 2; fi

# 1. wheels for the device's Python (3.12, x86-64); pure-Python ones match any platform tag
mkdir -p .whl
for pin in "${PINS[@]}"; do  # one version of each: two wheels of one package stop the whole install there
  name=${pin%%==*}; name=${name//-/_}
  rm -f .whl/"${name}"-*.whl .whl/"${name^}"-*.whl
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${PINS[@]}"

# 2. the commit (and the uncommitted .py files) of the tree that travels
"$PYTHON" - <<'EOF'
import json, subprocess
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout
dirty = [l[3:] for l in git("status", "--porcelain").splitlines() if l[3:].endswith(".py")]
stamp = {"commit": git("rev-parse", "HEAD").strip(), "dirty_python_files": dirty,
         "written": subprocess.run(["date", "-Iseconds"], capture_output=True, text=True).stdout.strip(),
         "by": "tools/bench/gpu_wheels.sh"}
open(".whl/git_state.json", "w").write(json.dumps(stamp, indent=1) + "\n")
EOF

git check-ignore -q .whl/x.whl || { echo "gpu_wheels.sh: .whl is not ignored by git" >&2; exit 1; }

ls -l .whl
du -sh .whl
