#!/usr/bin/env bash
# The main job, run by `make demo` after set-up and build: builds the default offline
# dataset and trains a small SAN on it (on the GPU when there is one, else on the CPU
# through the host backend), printing falling losses and a sample.
#
# Until the SAN trainer (train_san.cu) lands, this runs what exists: the dataset build
# and the executor benchmark, and says that training is not there yet.
set -euo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
data_dir=${DATA_DIR:-data/offline}

if [ -f dev/data/build_offline.py ]; then
  if [ ! -f "$data_dir/.complete" ]; then
    echo "demo: building the offline dataset in $data_dir"
    $python dev/data/build_offline.py --out "$data_dir"
    touch "$data_dir/.complete"
  else
    echo "demo: offline dataset already in $data_dir"
  fi
fi

if [ -x ./train_san ]; then
  ./train_san --preset demo --data "$data_dir" "$@"
else
  echo "demo: ./train_san has not landed yet (issue 4); running the executor benchmark instead"
  best=$(make -s print-BEST_DIR)
  "$best/backend_overhead"
fi
