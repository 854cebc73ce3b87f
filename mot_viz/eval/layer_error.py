"""Per-layer error of the MoT cache against the target's native cache, per example: layer_error.csv of a results
folder, written by ``--layer_error`` of evaluate and long_context, or afterwards, for a folder already written, by

    python -m mot_viz.eval.layer_error results/eval/smollm2-to-gemma3-mid-squad300 [--budgets 512 1024]

which rebuilds the folder's examples from its summary.json settings and translates each again (the translation is
deterministic: no answer is regenerated). The file, its metrics (the Per-layer cache error page's, comparison
"replayed": per target layer, the relative L2 error ‖mot − native‖ / ‖native‖ and the mean per-token cosine of the
cache the "mot" condition answers from against the native one, for K and for V, over the context positions) and its
reading and writing: mot_viz.eval.layer_error_file.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from ..cli import run_cli
from ..data.eval_data import load_dataset
from ..data.long_context import long_examples
from ..engine.checkpoint import load_checkpoint, read_config
from ..engine.models import load_model
from ..engine.mot import translate
from ..engine.prompts import build_prompt
from ..errors import ConfigError
from ..fsutil import check_out_place, checkout_path
from .layer_error_file import UNITS, LayerErrorFile, example_key
from .long_settings import LongSettings
from .qa_settings import EvalSettings, load_evaluated, truncate_context
from .results_folder import RESULTS_TABLE, SETTINGS_FILE, results_rows, writer_of


def _kind(folder: Path) -> tuple[str, dict]:
    """Which evaluation wrote `folder` ("evaluate" or "long_context") and its settings; ConfigError otherwise."""
    fix = ("Pass a folder that python -m mot_viz.eval.evaluate or long_context wrote with --out, e.g. "
           "results/eval/smollm2-to-gemma3-mid-squad300.")
    writer = writer_of(folder)
    name = writer.rsplit(".", 1)[-1] if writer else None
    if name not in UNITS or not (folder / RESULTS_TABLE).is_file():
        what = f"holds results of {writer}" if writer else "is not a results folder"
        raise ConfigError(f"{folder} {what}, not of evaluate or long_context. {fix}")
    try:
        settings = json.loads((folder / SETTINGS_FILE).read_text())["settings"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{folder} has no readable {SETTINGS_FILE} ({exc}). {fix}") from exc
    return name, settings


def record(folder: str | Path, budgets: tuple[int, ...] | None = None, progress: bool = True) -> Path:
    """Write `folder`'s layer_error.csv for every scored example it holds (of `budgets` only, for a long_context
    folder, when given), keeping the rows it already has (the command resumes)."""
    folder = Path(folder)
    check_out_place(folder, "RESULTS")  # a folder it can write into, before any work
    name, raw = _kind(folder)
    rows = results_rows(folder, name, (*UNITS[name], "condition"))
    scored = {example_key(k) for k in zip(*(rows.loc[rows["condition"] != "skipped", c] for c in UNITS[name]))}
    layers = LayerErrorFile(folder, UNITS[name], scored)
    settings = (EvalSettings if name == "evaluate" else LongSettings).from_json(raw)
    # a folder copied out of the checkout names its checkpoint relative to it
    settings = replace(settings, checkpoint=str(checkout_path(settings.checkpoint)))
    if name == "long_context" and budgets and set(budgets) - set(settings.budgets):
        raise ConfigError(f"--budgets {' '.join(map(str, budgets))}: {folder} holds the budgets "
                          f"{' '.join(map(str, settings.budgets))}. Pass some of those.")
    config = read_config(settings.checkpoint)
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    if name == "evaluate":
        mot = load_evaluated(settings.checkpoint, settings, source, target)  # replays as the run did
        todo = [(truncate_context(target, e, settings.max_context_tokens), {"dataset": e.dataset, "id": e.id})
                for d in settings.datasets for e in load_dataset(d, n=settings.n, seed=settings.seed)]
    else:
        mot = load_checkpoint(settings.checkpoint, source, target)[0]
        todo = [(d.example, {"budget": d.budget, "id": d.example.id}) for b in (budgets or settings.budgets)
                for d in long_examples(settings.source, target.tokenizer, b, settings.n, settings.seed)]
    todo = [(e, unit) for e, unit in todo if example_key(unit.values()) in scored - layers.done]
    for example, unit in tqdm(todo, desc="layer error", disable=not progress, dynamic_ncols=True):
        text = build_prompt(example, target.chat_frame).context_text  # the context the evaluation translated
        layers.add(translate(mot, source, target, text), mot.channels, **unit)
    return layers.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record the per-layer K/V error of the MoT cache against the "
                                                 "native one for every example of an evaluation's results folder")
    parser.add_argument("results", help="a folder python -m mot_viz.eval.evaluate or long_context wrote with --out")
    parser.add_argument("--budgets", type=int, nargs="+", help="long_context folders: only these budgets")
    args = parser.parse_args(argv)
    return run_cli(lambda: print(f"wrote {record(args.results, tuple(args.budgets or ()))}"))


if __name__ == "__main__":
    sys.exit(main())
