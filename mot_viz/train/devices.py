"""Where a training run computes: its device, its process group, bfloat16 autocast, and the note a resume on
another device leaves.

A run trains on the device of its models: ``--device`` (TrainConfig.device), else $MOT_VIZ_DEVICE, else the CPU
(mot_viz.engine.models.model_device). Every tensor it makes follows the models (style principle 9): the bank is
loaded onto that device, the ridge fits run there in float64, the translator and the optimiser live there. Under
torchrun each process takes its own GPU (cuda:LOCAL_RANK) and the process group is NCCL; on the CPU it is gloo.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import torch

from ..engine.models import model_device
from ..errors import ConfigError

AUTOCAST_MODES = ("none", "bf16")  # TrainConfig.autocast: forward_autocast's modes


def run_device(device: str = "") -> torch.device:
    """The device a run (this process) trains on: `device`, else $MOT_VIZ_DEVICE, else the CPU; on CUDA under torchrun
    a bare 'cuda' means this process's own GPU (LOCAL_RANK). Refused (ModelLoadError) before anything loads when the
    device is not there."""
    chosen = model_device(device or None)
    if chosen.type == "cuda" and chosen.index is None:
        chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    return chosen


def process_group_backend(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device.type == "cuda" else "gloo"


def process_group():
    """torch.distributed once this process has joined the process group of a torchrun, else None."""
    return torch.distributed if torch.distributed.is_available() and torch.distributed.is_initialized() else None


def init_distributed(device: torch.device, timeout: datetime.timedelta | None = None) -> tuple[int, int]:
    """(rank, world size); joins the process group (NCCL on GPUs, gloo on the CPU) when launched by torchrun /
    accelerate (WORLD_SIZE above 1). timeout: how long a collective waits for the slowest process (torch's default
    when None)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(process_group_backend(device), timeout=timeout)
    return int(os.environ.get("RANK", "0")), world


def ddp_kwargs(device: torch.device) -> dict:
    """DistributedDataParallel's device arguments for a module on `device` (its one GPU, or none on the CPU)."""
    return {"device_ids": [device.index], "output_device": device.index} if device.type == "cuda" else {}


def forward_autocast(device: torch.device, mode: str = "none"):
    """A context for the forward passes of one training row: bfloat16 autocast on `device` for mode 'bf16', else
    nothing (float32 throughout). The translator's parameters, gradients and optimiser state stay float32 either way."""
    if mode not in AUTOCAST_MODES:
        raise ConfigError(f"autocast must be one of {AUTOCAST_MODES}, not {mode!r}")
    return contextlib.nullcontext() if mode == "none" else torch.autocast(device.type, dtype=torch.bfloat16)


def check_fits(device: torch.device, nbytes: int, what: str, fix: str) -> None:
    """Refuse (ConfigError naming `fix`) to move `nbytes` of `what` onto a GPU with less than twice that free: the
    fits and steps that read it need room beside it. The CPU's memory is left to the operating system."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    if 2 * nbytes > free:
        raise ConfigError(f"{what} ({nbytes / 2**30:.1f} GiB) does not fit on {device} beside what the steps need "
                          f"({free / 2**30:.1f} GiB free): {fix}")


def resume_note(saved: str | None, now: torch.device) -> str:
    """The log line of a resume: bit for bit on the CPU it was saved on, to rounding on another device (or on a GPU,
    whose atomic-add kernels may round differently from one run to the next)."""
    if saved is None or (torch.device(saved).type == now.type == "cpu"):
        return f"on {now}, the device it was saved on: the steps continue bit for bit as an uninterrupted run's"
    if torch.device(saved).type == now.type:
        return (f"on {now}, the device type it was saved on: the steps continue from the saved state; GPU kernels may "
                "round differently from run to run, so they match an uninterrupted run to rounding")
    return (f"on {now}, but it was saved on {saved}: the weights and the optimiser state are the saved ones, yet the "
            "two devices' kernels round differently, so the steps match an uninterrupted run to rounding, not bit for "
            "bit")
