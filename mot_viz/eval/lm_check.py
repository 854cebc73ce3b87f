"""Held-out language-modelling check of a checkpoint (method.md §8, 'OpenWebText validation').

    python -m mot_viz.eval.evaluate --checkpoint pretrained/smollm2-to-gemma3 --lm_sequences 200 --datasets \
        --out results/eval/smollm2-to-gemma3-lm

On sequences of the stream the translator trained on, continued past its bank (held out), the target's
cross-entropy on each sequence's prompt tokens given each condition's cache of its context; writes lm.csv and lm.md
into the evaluation's results folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from ..data.corpus import split_sequence, training_sequences
from ..engine import hf
from ..engine.cache_errors import kv_cosine
from ..engine.checkpoint import read_config
from ..engine.models import LoadedModel, load_model
from ..engine.mot import MoT, translate
from ..fsutil import write_csv_atomic, write_text_atomic
from ..sharing.caches import condition_caches
from ..sharing.registry import method
from .answers import CONDITIONS
from .qa_metrics import bootstrap_ci
from .qa_settings import EvalSettings, load_evaluated


@torch.no_grad()
def lm_losses(mot: MoT, source: LoadedModel, target: LoadedModel, rows: torch.Tensor, prefix_tokens: int = 64,
              seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Held-out language-modelling check (method.md §8, 'OpenWebText validation'): per row, the target's
    cross-entropy on the prompt tokens given each condition's cache of the context (nats per token)."""
    out = []
    for i, row in enumerate(tqdm(rows, desc="lm", disable=not progress, dynamic_ncols=True)):
        context, prompt, labels = split_sequence(row[None].to(target.device), prefix_tokens)
        text = target.tokenizer.decode(context[0])
        translation = translate(mot, source, target, text)
        if not torch.equal(translation.target_ids, context):  # decode/re-encode changed the tokens: skip, counted
            out.append({"row": i, "condition": "skipped"})
            continue
        # the context is translated
        caches = condition_caches(mot, source, target, None, translation, seed, CONDITIONS).kv
        for condition, kv in caches.items():
            logits = hf.run(target.model, prompt, kv).logits[0].float()
            ce = float(torch.nn.functional.cross_entropy(logits, labels[0]))
            translated = method(condition).reads_source and method(condition).comparable  # a translated window
            out.append({"row": i, "condition": condition, "ce": ce,
                        "kv_cosine": kv_cosine(kv, translation.native_kv) if translated else np.nan})
    return pd.DataFrame(out)


def run_lm(settings: EvalSettings, out_dir: Path, n: int) -> pd.DataFrame:
    """The held-out LM check for a checkpoint; writes lm.csv and lm.md into out_dir."""
    config = read_config(settings.checkpoint)
    train_cfg = config.get("training", {})
    source, target = load_model(config["source"]["name"]), load_model(config["target"]["name"])
    mot = load_evaluated(settings.checkpoint, settings, source, target)
    bank = train_cfg.get("num_sequences", 2048)
    # the same deterministic stream the translator trained on, continued past its bank: held out
    rows = training_sequences(target.tokenizer, train_cfg.get("total_tokens", 128), n_sequences=bank + n,
                              seed=train_cfg.get("seed", 42))[bank:]
    df = lm_losses(mot, source, target, rows, train_cfg.get("prefix_tokens", 64), settings.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(out_dir / "lm.csv", df)
    scored = df[df["condition"] != "skipped"]
    lines = [f"Held-out LM check: {scored['row'].nunique()} LAMBADA sequences after the training bank "
             f"(skipped {int((df['condition'] == 'skipped').sum())}); target cross-entropy on the 64 prompt tokens, nats/token.", "",
             "| condition | CE mean [95% CI] | KV cosine to native |", "|---|---|---:|"]
    for condition in CONDITIONS:
        part = scored[scored["condition"] == condition]
        ci = bootstrap_ci(part["ce"].to_numpy(), n_boot=settings.bootstrap, seed=settings.seed)
        cos = part["kv_cosine"].mean()
        lines.append(f"| {condition} | {ci.mean:.3f} [{ci.lo:.3f}, {ci.hi:.3f}] | {'' if np.isnan(cos) else f'{cos:.3f}'} |")
    write_text_atomic(out_dir / "lm.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return df
