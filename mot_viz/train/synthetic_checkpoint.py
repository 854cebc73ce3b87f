"""python -m mot_viz.train.synthetic_checkpoint: the checkpoint of a synthetic pair's translator (a training recipe's
shape with seeded random weights, engine.testing.synthetic_mot), so the app, the evaluator and the benchmarks can load
one for synthetic models. It measures no quality."""

from __future__ import annotations

import argparse
import sys

from ..cli import run_cli
from ..engine.checkpoint import save_checkpoint
from ..engine.models import load_model
from ..engine.synthetic import NO_QUALITY, is_synthetic
from ..engine.testing import synthetic_mot
from ..errors import ConfigError
from .config import parse_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mot_viz.train.synthetic_checkpoint",
        description="Write the checkpoint of a synthetic pair's translator: a recipe's shape with seeded random weights "
                    "(what the app, the evaluator and the benchmarks load for synthetic models; it measures no quality).")
    parser.add_argument("--source", required=True, help="a synthetic source model, e.g. synthetic:llama3.2-1b")
    parser.add_argument("--target", required=True, help="a synthetic target model, e.g. synthetic:qwen2.5-1.5b")
    parser.add_argument("--recipe", default="configs/smollm2-to-gemma3.json", help="the training recipe whose shape it takes")
    parser.add_argument("--seed", type=int, default=0, help="seeds the translator's weights")
    parser.add_argument("--out", required=True, help="the checkpoint folder written (e.g. pretrained/llama-to-qwen-synthetic)")
    args = parser.parse_args(argv)

    def write() -> None:
        if not (is_synthetic(args.source) and is_synthetic(args.target)):
            raise ConfigError("--source and --target must both be synthetic models (synthetic:<name>): a real pair's "
                              "translator is trained (python -m mot_viz.train.train) or fitted (mot_viz.train.quickfit).")
        recipe = parse_args(["--config", args.recipe])[0]  # refused before any model is built
        source, target = load_model(args.source), load_model(args.target)
        mot = synthetic_mot(source, target, recipe, seed=args.seed)
        path = save_checkpoint(mot, args.out, training={"source": args.source, "target": args.target,
                                                        "recipe": args.recipe, "seed": args.seed},
                               metrics={"note": NO_QUALITY})
        print(f"{path}: {NO_QUALITY}")

    return run_cli(write)


if __name__ == "__main__":
    sys.exit(main())
