#!/usr/bin/env bash
# Train the dashboard's demo run into runs/demo once (scripts/install.sh runs this), so that the first
# `streamlit run app.py` opens on a trained model. The same run the dashboard trains by itself, in the
# background, whenever runs/demo holds none: digits, $MUNKEY_PROFILE (default cpu), the profile's
# recipe. An existing run is kept; MUNKEY_DEMO_RUN=0 skips it. A failure leaves the install usable.
set -uo pipefail
cd "$(dirname "$0")/.."
[ "${MUNKEY_DEMO_RUN:-1}" != "0" ] || exit 0
[ -e runs/demo/config.json ] && { echo "the demo run is already trained (runs/demo)"; exit 0; }
echo "training the dashboard's demo run into runs/demo (once; MUNKEY_DEMO_RUN=0 skips it)..."
# all cores but one, as the dashboard's own training does: on a busy 2-core machine torch's 2 threads
# stall at every barrier (an epoch 5x slower than with 1); OMP_NUM_THREADS set by the caller wins
THREADS=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
( umask 077 && export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}" && .venv/bin/munkey train --dataset digits --profile "${MUNKEY_PROFILE:-cpu}" --out runs/demo ) \
  || echo "the demo run was not trained here; the dashboard trains it on first start"
exit 0
