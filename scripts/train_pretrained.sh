#!/usr/bin/env bash
# Trains the shipped checkpoints one after another (2 CPU cores: sequential is fastest), then copies each
# finished run into pretrained/<name> as fp16. Logs: runs/<name>/train.log. Rerun to resume unfinished runs.
# One thread per run: on two shared cores, two-thread torch processes slow each other down many times over.
# Each -linear run builds the pair's bank (cached in ~/.cache/mot_viz/banks); the MoT of the same window reuses it.
set -uo pipefail
cd "$(dirname "$0")/.."
default="smollm2-to-gemma3-linear smollm2-to-gemma3 smollm2-to-gemma3-mid-linear smollm2-to-gemma3-mid
smollm2-to-gemma3-mid-single gemma3-to-smollm2-linear smollm2-to-smollm2-linear gemma3-to-smollm2 smollm2-to-smollm2
smollm2-to-gemma3-direct smollm2-to-gemma3-direct-depth-matched smollm2-to-gemma3-c2c-pr smollm2-to-gemma3-c2c
smollm2-to-gemma3-lsc smollm2-to-gemma3-interlat"
# the other ways of sharing trained here (python -m mot_viz.train.rival, docs/decisions.md 40), as they were shipped:
# each planned for a first --max_steps, stopped after a step, then resumed to a shorter one (the cosine decay
# re-planned there); <method> "<first run's flags>" <stopped after> <resumed to>
rival_plan() {
  case "$1" in
    c2c-pr) echo "--max_steps 300 --batch_size 4|100|150" ;;
    c2c) echo "--max_steps 150 --batch_size 4|20|80" ;;
    lsc) echo "--max_steps 250 --batch_size 4|25|120" ;;
    interlat) echo "--max_steps 120 --batch_size 2 --warmup_steps 10|30|60" ;;
  esac
}
for name in ${@:-$default}; do
  method="${name#smollm2-to-gemma3-}"
  if [[ -n "$(rival_plan "$method")" ]]; then
    IFS='|' read -r flags stop resumed <<< "$(rival_plan "$method")"
    run=(.venv/bin/python -m mot_viz.train.rival --output_dir "runs/$name")
    if [ ! -f "runs/$name/train_config.json" ]; then
      OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "${run[@]}" --method "$method" $flags --learning_rate 5e-4 \
        --corpus_tokens 400000 --stop_after "$stop" >> "runs/$name.log" 2>&1 || { echo "$name failed"; continue; }
    fi
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "${run[@]}" --resume --max_steps "$resumed" --export "pretrained/$name" \
      >> "runs/$name.log" 2>&1 || { echo "$name failed"; continue; }
    cp "runs/$name/log.jsonl" "pretrained/$name/"
    continue
  fi
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
