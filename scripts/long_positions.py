"""What a translated window carries along a long document: the relative error of the translated and replayed K/V per
window layer and per stretch of the document, averaged over distractor stacks (mot_viz.analysis.long_context).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/long_positions.py --checkpoint pretrained/smollm2-to-gemma3-mid \
        --budget 2048 --n 6 --out results/long/smollm2-to-gemma3-mid-positions-2048.md

Each document is cut into --bins equal stretches of context positions; a row is one window layer (global or
sliding), a column one stretch, the cell the mean over documents. The last stretch is where the question reads
every layer directly; in a sliding layer it reads only the last `sliding_window` positions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from mot_viz.analysis.long_context import position_error_table
from mot_viz.data.long_context import distractor_stacks
from mot_viz.engine.checkpoint import load_checkpoint, read_config
from mot_viz.engine.models import load_model
from mot_viz.engine.mot import translate
from mot_viz.engine.prompts import build_prompt
from mot_viz.cli import run_cli
from mot_viz.fsutil import check_out_place, write_text_atomic

TITLE = "Relative L2 error against native"  # how the markdown it writes begins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--budget", type=int, default=2048, help="target tokens per document")
    parser.add_argument("--n", type=int, default=6, help="distractor stacks (depths start / middle / end in turn)")
    parser.add_argument("--bins", type=int, default=8, help="stretches of the document")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="markdown file (printed otherwise; an earlier one is replaced)")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out file this script did not write")
    args = parser.parse_args()
    if args.out:  # before any model loads
        check_out_place(args.out, folder=False, overwrite=args.overwrite,
                        ours=lambda path: path.read_bytes().startswith(TITLE.encode()))
    config = read_config(args.checkpoint)
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    mot, _ = load_checkpoint(args.checkpoint, source, target)
    frames = []
    for doc in tqdm(distractor_stacks(target.tokenizer, args.budget, args.n, args.seed), desc="documents"):
        translation = translate(mot, source, target, build_prompt(doc.example, target.chat_frame).context_text)
        n = int(translation.target_ids.shape[1])
        table = position_error_table(translation, mot.channels, target.spec, bin_tokens=-(-n // args.bins))
        frames.append(table.assign(stretch=table["position"] * args.bins // n, id=doc.example.id))
    table = pd.concat(frames)
    lines = [f"{TITLE}, `{args.checkpoint}`, {args.n} distractor stacks of {args.budget} "
             f"target tokens (seed {args.seed}); stretch 1 is the document's first {100 // args.bins}%, stretch "
             f"{args.bins} its last. Command: `python scripts/long_positions.py --checkpoint {args.checkpoint} "
             f"--budget {args.budget} --n {args.n} --bins {args.bins} --seed {args.seed}`."]
    for comparison in ("translated", "replayed"):
        for kv in ("K", "V"):
            part = table[(table["comparison"] == comparison) & (table["kv"] == kv)]
            wide = part.pivot_table(index=["layer", "attention"], columns="stretch", values="value", aggfunc="mean")
            lines += ["", f"**{comparison} {kv}**", "",
                      "| layer | attention | " + " | ".join(str(int(c) + 1) for c in wide.columns) + " |",
                      "|---:|---|" + "---:|" * len(wide.columns)]
            lines += [f"| {layer} | {attention} | " + " | ".join(f"{v:.3f}" for v in row) + " |"
                      for (layer, attention), row in wide.iterrows()]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, text)
    print(text)


if __name__ == "__main__":
    sys.exit(run_cli(main))
