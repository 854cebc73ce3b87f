"""python -m mot_viz.train.synthetic_checkpoint: the checkpoint of a synthetic pair's translator (a training recipe's
shape with seeded random weights, engine.testing.synthetic_mot), so the app, the evaluator and the benchmarks can load
one for synthetic models. It measures no quality."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli import run_cli
from ..engine.checkpoint import CONFIG_FILE, WEIGHTS_FILE, save_checkpoint
from ..engine.models import load_pair
from ..engine.synthetic import NO_QUALITY, is_synthetic
from ..engine.testing import synthetic_mot
from ..errors import ConfigError
from ..fsutil import CHECKOUT, check_out_place, checkout_path
from .config import read_recipe

RECIPE = "configs/smollm2-to-gemma3.json"  # the default recipe, from the checkout whatever the working folder


def written_here(path: Path) -> bool:
    """Whether path is a file of a checkpoint this command wrote (config.json and the weights of a folder whose
    metrics say it measures no quality), which a later run may replace."""
    try:
        ours = json.loads((path.parent / CONFIG_FILE).read_text()).get("metrics", {}).get("note") == NO_QUALITY
    except (OSError, ValueError, AttributeError):
        return False
    return ours and path.name in (CONFIG_FILE, WEIGHTS_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mot_viz.train.synthetic_checkpoint",
        description="Write the checkpoint of a synthetic pair's translator: a recipe's shape with seeded random weights "
                    "(what the app, the evaluator and the benchmarks load for synthetic models; it measures no quality).")
    parser.add_argument("--source", required=True, help="a synthetic source model, e.g. synthetic:llama3.2-1b")
    parser.add_argument("--target", required=True, help="a synthetic target model, e.g. synthetic:qwen2.5-1.5b")
    parser.add_argument("--recipe", default=RECIPE,
                        help=f"the training recipe whose shape it takes (default {RECIPE} of the checkout)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the translator's weights")
    parser.add_argument("--out", required=True, help="the checkpoint folder written (e.g. pretrained/llama-to-qwen-synthetic)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an --out folder holding files other than a synthetic checkpoint this "
                             "command wrote")
    args = parser.parse_args(argv)

    def write() -> None:
        check_out_place(Path(args.out), ours=written_here, overwrite=args.overwrite)  # before any model is built
        if not (is_synthetic(args.source) and is_synthetic(args.target)):
            raise ConfigError("--source and --target must both be synthetic models (synthetic:<name>): a real pair's "
                              "translator is trained (python -m mot_viz.train.train) or fitted (mot_viz.train.quickfit).")
        recipe_path = CHECKOUT / RECIPE if args.recipe == RECIPE else checkout_path(args.recipe)
        recipe = read_recipe(recipe_path, "--recipe")  # refused before any model is built
        source, target = load_pair(args.source, args.target)  # both names and sizes checked before either
        mot = synthetic_mot(source, target, recipe, seed=args.seed)
        path = save_checkpoint(mot, args.out, training={"source": args.source, "target": args.target,
                                                        "recipe": args.recipe, "seed": args.seed},
                               metrics={"note": NO_QUALITY}, overwrite=args.overwrite)
        print(f"{path}: {NO_QUALITY}")

    return run_cli(write)


if __name__ == "__main__":
    sys.exit(main())
