#!/usr/bin/env bash
# Trains an experiment's linear map and the mixture on it, exports both, and measures their window fidelity:
#   bash scripts/train_experiment.sh <name>   (configs/experiments/<name>-linear.json and <name>.json)
# The mixture's config names runs/experiments/export/<name>-linear as its linear_from. One thread per job.
# Exports: runs/experiments/export/<name>{-linear,}; per-context CSVs: results/fidelity/experiments/<name>{-linear,}-*.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
out="runs/experiments/export"
for run in "$name-linear" "$name"; do
  mkdir -p "runs/experiments/$run"
  resume=""; [ -f "runs/experiments/$run/train_config.json" ] && resume="--resume"
  .venv/bin/python -m mot_viz.train --config "configs/experiments/$run.json" $resume >> "runs/experiments/$run/train.log" 2>&1
  shared=""; [ "$run" = "$name" ] && shared="--shared_linear $out/$name-linear"
  .venv/bin/python -m mot_viz.export "runs/experiments/$run" "$out/$run" $shared
done
.venv/bin/python -m mot_viz.fidelity --checkpoint "$out/$name-linear" "$out/$name" --n 40 \
  --corpus squad lambada-heldout --out results/fidelity/experiments
