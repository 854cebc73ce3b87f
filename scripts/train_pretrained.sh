#!/usr/bin/env bash
# Trains the shipped checkpoints one after another (2 CPU cores: sequential is fastest), then copies each
# finished run into pretrained/<name> as fp16. Logs: runs/<name>/train.log. Rerun to resume unfinished runs.
# One thread per run: on two shared cores, two-thread torch processes slow each other down many times over.
# Each -linear run builds the pair's bank (cached in ~/.cache/mot_viz/banks); the MoT of the same window reuses it.
set -uo pipefail
cd "$(dirname "$0")/.."
default="smollm2-to-gemma3-linear smollm2-to-gemma3 smollm2-to-gemma3-mid-linear smollm2-to-gemma3-mid
smollm2-to-gemma3-mid-single gemma3-to-smollm2-linear smollm2-to-smollm2-linear gemma3-to-smollm2 smollm2-to-smollm2
smollm2-to-gemma3-direct smollm2-to-gemma3-direct-depth-matched"
for name in ${@:-$default}; do
  # the full-depth maps without replay: closed-form fits, no run (the bank of the top-k recipe resumes if killed)
  if [[ "$name" == smollm2-to-gemma3-direct* ]]; then
    recipe="top_k"; [[ "$name" == *-depth-matched ]] && recipe="depth_matched"
    rm -rf "pretrained/$name"
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" .venv/bin/python -m mot_viz.train.quickfit --direct --direct_recipe "$recipe" \
      --source smollm2-135m --target gemma3-270m --out "pretrained/$name" || echo "$name failed"
    continue
  fi
  mkdir -p "runs/$name"
  resume=""; [ -f "runs/$name/train_config.json" ] && resume="--resume"  # continue an unfinished run
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" .venv/bin/python -m mot_viz.train.train --config "configs/$name.json" $resume >> "runs/$name/train.log" 2>&1 || { echo "$name failed"; continue; }
  # Gemma-3 -> SmolLM2 replays densely: there the source-chosen sparse pattern costs half of native F1
  # (docs/results/single-passages.md, docs/decisions.md); the others keep the replay they trained with (the method's sparse one)
  replay="checkpoint"; [[ "$name" == gemma3-to-smollm2 || "$name" == gemma3-to-smollm2-linear ]] && replay="dense"
  # a linear-initialised mixture stores its fixed linear path once, in the -linear checkpoint of its window
  linear="pretrained/${name%-single}-linear"
  if [[ "$name" != *-linear ]] && grep -q '"init": "linear"' "configs/$name.json" && [ -d "$linear" ]; then
    .venv/bin/python -m mot_viz.train.export "runs/$name" "pretrained/$name" --shared_linear "$linear" --replay "$replay" --overwrite && continue
    echo "$name: its linear path differs from $linear; exported in full"
  fi
  .venv/bin/python -m mot_viz.train.export "runs/$name" "pretrained/$name" --replay "$replay" --overwrite
done
