"""Train a MoT edge with the Context Correction Loss (method.md §7).

    python -m mot_viz.train.train --config configs/smollm2-to-gemma3.json --max_steps 300
    python -m mot_viz.train.train --output_dir runs/x --resume          # continue a killed run
    python -m mot_viz.train.train --config ... --device cuda --autocast bf16   # on a GPU, bfloat16 forward passes
    torchrun --nproc_per_node 2 -m mot_viz.train.train --config ...     # several processes: DistributedDataParallel (gloo/NCCL)

Both LMs are frozen; only the translator pool trains. Loss per row:
CE(target on the 64 prompt tokens from the mixed cache, labels) + λ·(MSE_K + MSE_V) over the target
layers from the window start up. Checkpoints are MoT checkpoint folders plus the optimiser state in
safetensors, written atomically, so ``--resume`` gives the same result as an uninterrupted run. Everything runs on
the models' device (mot_viz.train.devices). Ctrl-C stops after the step in progress and saves it.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..cli import logger, run_cli
from ..data.corpus import split_sequence, training_sequences
from ..engine import hf
from ..engine.channels import (Channels, depth_ratio_candidates, depth_ratio_window, injection_channels,
                               terminal_channels, window_size_range)
from ..engine.checkpoint import copy_linear_path
from ..engine.layout import window_blocks
from ..engine.models import LoadedModel, load_model
from ..engine.mot import MoT, ReplayConfig, native_cache, prepare_source, replay, sparse_indices, translate_window
from ..engine.translator import TranslatorOutput, gate_balance
from ..errors import ConfigError, ContextError, MotVizError
from . import runs
from .bank import build_bank
from .config import TrainConfig, parse_args  # noqa: F401  (the CLI's and the tests' entry points)
from .devices import ddp_kwargs, forward_autocast, init_distributed, resume_note, run_device
from .devices import process_group as _dist
from .fit import balance_loss, bank_stage, cosine_lr, cross_fitted_rows, fit_linear, trainable_parameters


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate for optimiser step `step` (1-based): linear warm-up, then cosine to 0 (method.md §7, §12)."""
    return cosine_lr(cfg.learning_rate, step, cfg.warmup_steps, cfg.max_steps)


@dataclass
class LossTerms:
    total: torch.Tensor
    ce: float
    mse_k: float
    mse_v: float
    tr_mse: float = 0.0  # MSE of the injected window K + V against native (the translation term)
    balance: float = 0.0
    window: TranslatorOutput | None = None  # the translator's output for the row (its routing gates are logged)


def row_loss(mot: MoT, source: LoadedModel, target: LoadedModel, row: torch.Tensor, prefix_tokens: int,
             mse_weight: float, translation_weight: float = 0.0, balance_weight: float = 0.0,
             autocast: str = "none") -> LossTerms:
    """The Context Correction Loss of one training row [T] (method.md §7), plus the project's optional terms.

    translation_weight adds λ_tr·(MSE(injected K, native K) + MSE(V)) over the window layers: the
    replayed cache alone never compares the translator's output with what it replaces (method.md §6).
    autocast 'bf16': the forward passes run under bfloat16 autocast; the loss terms are summed in float32.
    """
    context, prompt, labels = split_sequence(row[None].to(target.device), prefix_tokens)
    with forward_autocast(target.device, autocast):
        src = prepare_source(mot, source, target, context)
        native = native_cache(target, context)
        out = translate_window(mot, src, source, target)
        native_k, native_v = window_blocks(native, mot.channels.target_layers, len(target.prefix_ids))
        sparse = sparse_indices(mot, src) if mot.replay.topk_sparse_attn else None
        mixed = replay(target, context, mot.channels.target_layers, out.keys, out.values, sparse)
        logits = hf.run(target.model, prompt, mixed).logits
    tr_mse = ((out.keys.float() - native_k.float()) ** 2).mean() + ((out.values.float() - native_v.float()) ** 2).mean()
    balance = balance_loss(out.key_routing) + balance_loss(out.value_routing)
    ce = torch.nn.functional.cross_entropy(logits[0].float(), labels[0])
    upper = range(mot.channels.start, mot.target.num_layers)
    mse_k = torch.stack([((mixed[l][0].float() - native[l][0].float()) ** 2).mean() for l in upper]).mean()
    mse_v = torch.stack([((mixed[l][1].float() - native[l][1].float()) ** 2).mean() for l in upper]).mean()
    total = ce + mse_weight * (mse_k + mse_v) + translation_weight * tr_mse + balance_weight * balance
    return LossTerms(total, ce.item(), mse_k.item(), mse_v.item(), tr_mse.item(), float(balance.detach()), out)


# ----- several processes: torchrun starts them, torch's DistributedDataParallel averages the gradients ------


def data_parallel(module: nn.Module) -> nn.Module:
    """`module` under DistributedDataParallel when several processes run, else itself.

    find_unused_parameters: top-k routing leaves some experts without a gradient on some ranks and steps.
    """
    if _dist() is None:
        return module
    device = next(module.parameters()).device
    return nn.parallel.DistributedDataParallel(module, find_unused_parameters=True, **ddp_kwargs(device))


@contextlib.contextmanager
def stop_after_step():
    """Ctrl-C (SIGINT) inside this block asks the loop to stop once the step in progress is done (yields the Event it
    sets); a second Ctrl-C interrupts at once. The interrupt thus never lands inside a library call that could swallow
    it, and the saved step is a whole one. Outside the main thread (no signal handler there) the Event stays unset."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_requested(requested: threading.Event, device: torch.device) -> bool:
    """Whether any process was asked to stop: under torchrun every rank then stops after the same step."""
    dist = _dist()
    if dist is None:
        return requested.is_set()
    flag = torch.tensor([float(requested.is_set())], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class RowLoss(nn.Module):
    """row_loss as a module (what DistributedDataParallel wraps); the frozen models are plain attributes."""

    def __init__(self, mot: MoT, source: LoadedModel, target: LoadedModel, cfg: TrainConfig):
        super().__init__()
        self.mot = mot
        self.source, self.target, self.cfg = source, target, cfg

    def forward(self, row: torch.Tensor) -> LossTerms:
        cfg = self.cfg
        return row_loss(self.mot, self.source, self.target, row, cfg.prefix_tokens, cfg.mse_weight,
                        translation_weight=cfg.translation_weight, balance_weight=cfg.balance_weight,
                        autocast=cfg.autocast)


# ----- channels -----------------------------------------------------------------------------------------


def resolve_channels(cfg: TrainConfig, source: LoadedModel, target: LoadedModel, bank: torch.Tensor,
                     log=print) -> tuple[Channels, dict]:
    """The injection window: fixed for injection/terminal, searched with proxy translators for depth-ratio."""
    l_s, l_t = source.spec.num_layers, target.spec.num_layers
    if cfg.layer_alignment == "injection":
        return injection_channels(l_s, l_t, cfg.injection_layer_start_idx, cfg.injection_window_size), {}
    if cfg.layer_alignment == "terminal":
        return terminal_channels(l_s, l_t, cfg.max_window_size_ratio), {}
    return proxy_window_search(cfg, source, target, bank, log)


def proxy_window_search(cfg: TrainConfig, source: LoadedModel, target: LoadedModel, bank: torch.Tensor,
                        log=print) -> tuple[Channels, dict]:
    """Depth-ratio window search (method.md §3): score windows with small single translators, grow greedily."""
    l_s, l_t = source.spec.num_layers, target.spec.num_layers
    n_cand = len(depth_ratio_candidates(l_s, l_t))
    m_min, m_max = window_size_range(l_s, l_t, cfg.min_window_size_ratio, cfg.max_window_size_ratio)
    val = bank[-cfg.proxy_val_sequences:]
    train_rows = bank[: -cfg.proxy_val_sequences]
    scores: dict[tuple[int, int], float] = {}

    def score(start: int, size: int) -> float:
        if (start, size) not in scores:
            torch.manual_seed(cfg.seed)
            channels = depth_ratio_window(l_s, l_t, start, size)
            proxy = MoT.build(source.spec, target.spec, channels, ReplayConfig(topk_sparse_attn=None),
                              **cfg.translator_kwargs(variant="single", key_space="post_rope", linear_residual=False)
                              ).to(target.device)
            opt = torch.optim.AdamW(proxy.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
            for i in range(cfg.proxy_steps):
                loss = row_loss(proxy, source, target, train_rows[i % len(train_rows)], cfg.prefix_tokens, cfg.mse_weight)
                opt.zero_grad()
                loss.total.backward()
                opt.step()
            with torch.no_grad():
                vals = [float(row_loss(proxy, source, target, r, cfg.prefix_tokens, cfg.mse_weight).total) for r in val]
            scores[(start, size)] = sum(vals) / len(vals)
            log(f"proxy window start={start} size={size}: validation loss {scores[(start, size)]:.4f}")
        return scores[(start, size)]

    best = min(range(n_cand - m_min + 1), key=lambda s: (score(s, m_min), -s))
    size = m_min
    while size < m_max:
        size += 1
        starts = [s for s in range(best - 2, best + 3) if 0 <= s <= n_cand - size]
        best = min(starts, key=lambda s: (score(s, size), -s))
    profile = {f"{s}:{w}": v for (s, w), v in scores.items()}
    return depth_ratio_window(l_s, l_t, best, size), {"proxy_scores": profile, "start": best, "size": size}


# ----- stage 1: the cached bank ---------------------------------------------------------------------------


def _bank_stages(cfg: TrainConfig, mot: MoT, source: LoadedModel, target: LoadedModel, run_dir: Path, rank: int,
                 world: int, log, progress: bool, params: list[torch.nn.Parameter]) -> dict:
    """Build (or reuse) the bank, fit the linear path in closed form, then the bank stage; returns their summary."""
    dist = _dist()
    if rank != 0 and dist is not None:
        dist.barrier()  # rank 0 builds the bank; the others then read it
    t0 = time.time()
    try:
        bank = build_bank(mot, source, target, cfg.bank_config(), progress=progress and rank == 0, device=target.device)
    except ContextError as exc:  # a context within the target's limit, re-tokenized longer than the source allows
        raise ConfigError(f"a training bank context of up to {cfg.bank_max_tokens} target tokens is too long for the "
                          f"source model once re-tokenized ({str(exc).split('. ')[0]}): lower --bank_max_tokens "
                          "(and --bank_min_tokens with it).") from exc
    if rank == 0 and dist is not None:
        dist.barrier()
    summary = {"bank": {"key": bank.folder.name, "contexts": bank.num_contexts,
                        "tokens": int(bank.lengths.sum()), "corpus": bank.manifest["bank"]["corpus"],
                        "seconds_to_load_or_build": round(time.time() - t0, 1)}}
    log(f"bank: {bank.num_contexts} contexts, {int(bank.lengths.sum())} tokens ({bank.folder})")
    if mot.translator.linear is not None:
        if cfg.linear_from:
            summary["linear_fit"] = copy_linear_path(mot, cfg.linear_from)
            log(f"linear path: copied from {cfg.linear_from}")
        else:
            summary["linear_fit"] = fit_linear(mot, bank, balanced=cfg.linear_rank_balanced)
            log(f"linear fit: λ_K {summary['linear_fit']['lambda_k']}, λ_V {summary['linear_fit']['lambda_v']} "
                f"in {summary['linear_fit']['seconds']} s")
        if cfg.variant != "linear":
            mot.translator.silence_experts()  # step 0 equals the closed-form map
    if cfg.bank_steps:
        log_path = run_dir / "bank_log.jsonl"
        if rank == 0:
            log_path.write_text("")

        def write(row: dict) -> None:
            if rank == 0:
                with open(log_path, "a") as f:
                    f.write(json.dumps(row) + "\n")

        linear_rows = None
        if cfg.bank_cross_fit:  # the experts learn the residual the map leaves out of sample
            lambdas = {kv: summary["linear_fit"].get(f"lambda_{kv}") for kv in "kv"}
            if None in lambdas.values():
                raise ConfigError("bank_cross_fit refits the map with its λ, which this map's record lacks: fit the "
                                  "map again (leave linear_from empty) or set bank_cross_fit to 0")
            lin_k, lin_v, summary["cross_fit"] = cross_fitted_rows(mot, bank, cfg.bank_cross_fit, lambdas)
            linear_rows = (lin_k, lin_v)
            log(f"cross-fitted map rows: {cfg.bank_cross_fit} folds, {summary['cross_fit']['seconds']} s")
        rows = bank_stage(mot, bank, cfg.bank_steps, cfg.bank_learning_rate, batch=cfg.bank_batch, crop=cfg.bank_crop,
                          weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip_norm,
                          balance_weight=cfg.balance_weight, seed=cfg.seed, rank=rank, world=world,
                          parallel=data_parallel, log=write, progress=progress,
                          params=params, layer_weighting=cfg.bank_layer_weighting, linear_rows=linear_rows)
        summary["bank_stage"] = rows[-1]
    if rank == 0:
        (run_dir / "bank_stage.json").write_text(json.dumps(summary, indent=2))
    return summary


# ----- the loop -----------------------------------------------------------------------------------------


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def train(cfg: TrainConfig, resume: bool = False, source: LoadedModel | None = None,
          target: LoadedModel | None = None, bank: torch.Tensor | None = None, progress: bool = True,
          overwrite: bool = False) -> Path:
    """Run (or resume) training; returns the run folder. Models and the sequence bank can be passed in (tests).

    A folder that holds a run needs resume (continue it) or overwrite (replace it); nothing is replaced silently.
    """
    from tqdm import tqdm

    device = run_device(cfg.device) if source is None else source.device  # refused here when it is not there
    rank, world = init_distributed(device)
    run_dir = Path(cfg.output_dir)
    if rank == 0:
        resume = runs.prepare_run_dir(run_dir, resume, overwrite)
        if resume:
            runs.check_same_config(run_dir, json.loads(json.dumps(asdict(cfg))),
                                   json.loads(json.dumps(asdict(TrainConfig()))))
        runs.clean_run_dir(run_dir)
    dist = _dist()
    if dist is not None:
        dist.barrier()  # the other ranks read the folder only once rank 0 has checked and recovered it
    resumed = resume and runs.has_state(run_dir)
    log = logger(__name__).info if rank == 0 else (lambda msg: None)
    _seed_everything(cfg.seed)
    source = source or load_model(cfg.source, device=device)
    target = target or load_model(cfg.target, device=device)
    if source.device != device or target.device != device or (cfg.device and run_device(cfg.device) != device):
        raise ConfigError(f"the models are on {source.device} and {target.device}, the run on {cfg.device or device}: "
                          "load both models on the device the run names (load_model(..., device=...)).")
    cfg.check_bank_length({lm.spec.name: lm.spec.max_positions - len(lm.prefix_ids) for lm in (source, target)})
    if bank is None:
        bank = training_sequences(target.tokenizer, cfg.total_tokens, n_sequences=cfg.num_sequences, seed=cfg.seed)
    if resumed:
        channels = Channels.from_json(json.loads((run_dir / "checkpoint" / "config.json").read_text())["channels"])
        channel_profile = json.loads((run_dir / "channel_profile.json").read_text()) if (run_dir / "channel_profile.json").exists() else {}
    else:
        channels, channel_profile = resolve_channels(cfg, source, target, bank, log)
    _seed_everything(cfg.seed)  # the translator's init does not depend on whether a search ran
    mot = MoT.build(source.spec, target.spec, channels, ReplayConfig(cfg.topk_sparse_attn, cfg.num_bottom_full_attn),
                    **cfg.translator_kwargs()).to(device)
    linear = mot.translator.linear
    if linear is not None:
        cfg.check_linear_widths(*(0 if b is None else b.shape[0] for b in (linear.previous_basis, linear.extra_basis)))
    created = not run_dir.exists()
    if rank == 0:  # made only now: a refused run (a missing model, no data, a setting the pair forbids) leaves none
        run_dir.mkdir(parents=True, exist_ok=True)
    params = trainable_parameters(mot, cfg.train_linear_path)
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    step = 0
    stage_metrics: dict = {}
    if resumed:
        step = runs.load_state(run_dir, mot, optimizer)
        stage_metrics = json.loads((run_dir / "bank_stage.json").read_text()) if (run_dir / "bank_stage.json").exists() else {}
        if rank == 0:
            runs.truncate_log(run_dir / runs.LOG_FILE, step)
        log(f"resumed from step {step}")
        log(f"resumed {resume_note(runs.saved_device(run_dir), device)}")
    elif rank == 0:
        (run_dir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
        (run_dir / "resolved_channels.json").write_text(json.dumps({"edge": channels.to_json()}, indent=2))
        if channel_profile:
            (run_dir / "channel_profile.json").write_text(json.dumps(channel_profile, indent=2))
        (run_dir / "log.jsonl").write_text("")
    if cfg.uses_bank and not resumed:  # stage 1: a killed run redoes it, deterministically, on --resume
        try:
            stage_metrics = _bank_stages(cfg, mot, source, target, run_dir, rank, world, log, progress, params)
        except MotVizError:  # a setting the data refuses: nothing of this run is left to block a rerun or --resume
            if rank == 0:
                runs.remove_run_files(run_dir, remove_folder=created)
            raise
        if cfg.max_steps == 0 and rank == 0:
            runs.save_state(run_dir, mot, optimizer, 0, asdict(cfg), stage_metrics)
    loss_fn = data_parallel(RowLoss(mot, source, target, cfg))
    mot.train()
    rows_per_step = cfg.batch_size * cfg.grad_accum_steps * world
    start_time = time.time()
    window: list[dict] = []
    bar = tqdm(total=cfg.max_steps, initial=step, disable=not progress or rank != 0, desc="train", dynamic_ncols=True)
    last: dict = {}
    completed = step  # the last step whose optimiser update is in the parameters
    with stop_after_step() as stop:
        try:
            while step < cfg.max_steps:
                step += 1
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(cfg, step)  # set before the step: no full-LR first step (method.md §12)
                optimizer.zero_grad(set_to_none=True)
                terms = {"ce": 0.0, "mse_k": 0.0, "mse_v": 0.0, "tr_mse": 0.0, "balance": 0.0, "loss": 0.0}
                local_rows = [((step - 1) * rows_per_step + i) % len(bank) for i in range(rank, rows_per_step, world)]
                routing = None
                for i, index in enumerate(local_rows):
                    # the ranks' gradients are averaged once, in the backward of this step's last local row
                    sync = i == len(local_rows) - 1 or not isinstance(loss_fn, nn.parallel.DistributedDataParallel)
                    with contextlib.nullcontext() if sync else loss_fn.no_sync():
                        t = loss_fn(bank[index])
                        (t.total / len(local_rows)).backward()
                    routing = t.window
                    for key, val in (("ce", t.ce), ("mse_k", t.mse_k), ("mse_v", t.mse_v), ("tr_mse", t.tr_mse),
                                     ("balance", t.balance), ("loss", t.total.item())):
                        terms[key] += val / len(local_rows)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm))
                optimizer.step()
                completed = step
                balance = {}
                gates = [r.gates for r in (routing.key_routing, routing.value_routing) if r is not None] if routing else []
                if gates:
                    per = [gate_balance(g.detach()) for g in gates]
                    balance = {k: sum(p[k] for p in per) / len(per) for k in per[0]}
                window.append({**terms, "grad_norm": grad_norm, **balance})
                bar.update(1)
                bar.set_postfix(ce=f"{terms['ce']:.3f}", mse_k=f"{terms['mse_k']:.3f}", mse_v=f"{terms['mse_v']:.3f}")
                if rank == 0 and (step % cfg.log_every == 0 or step == cfg.max_steps):
                    row = {"step": step, "lr": lr_at(cfg, step), "elapsed_s": round(time.time() - start_time, 1),
                           **{k: sum(w.get(k, 0.0) for w in window) / len(window) for k in window[0]}}
                    with open(run_dir / "log.jsonl", "a") as f:
                        f.write(json.dumps(row) + "\n")
                    last, window = row, []
                if rank == 0 and (step % cfg.save_every == 0 or step == cfg.max_steps):
                    runs.save_state(run_dir, mot, optimizer, step, asdict(cfg), {**stage_metrics, "last_log": last})
                if step < cfg.max_steps and _stop_requested(stop, device):
                    raise KeyboardInterrupt  # Ctrl-C during this step: it is whole, so it is the one saved
        except KeyboardInterrupt:
            if rank == 0 and completed > 0:
                # an unfinished step's gradients are discarded; the parameters are those of step `completed`
                runs.save_state(run_dir, mot, optimizer, completed, asdict(cfg), {**stage_metrics, "last_log": last})
                log(f"interrupted: checkpoint of step {completed} saved in {run_dir / 'checkpoint'} "
                    "(continue with --resume)")
            raise
        finally:
            bar.close()
    mot.eval()
    log(f"done: {step} steps in {time.time() - start_time:.0f} s -> {run_dir / 'checkpoint'}")
    if dist is not None:
        dist.barrier()
    return run_dir


def main(argv: list[str] | None = None) -> int:
    def body() -> None:
        cfg, resume, overwrite = parse_args(argv)
        train(cfg, resume=resume, overwrite=overwrite)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
