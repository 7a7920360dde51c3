"""Which attention path a packed row takes, as a function of where and how it runs.

Whether a path can run depends on the device, the model's dtype, torch's version, the
installed packages and the model's head size, and nothing else; `AttentionRuntime` holds
exactly that, so the choice is a pure function a CPU test can ask about any GPU set-up.
`AttentionRuntime.of_model` describes the model and machine at hand.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

import torch
from torch import nn

from workbench.trainer.compute.attention import ATTENTION_PATHS, AttentionChoice, AttentionPath

# "auto" takes the first of these that can run: FlashAttention's varlen kernel (in torch,
# then from the flash-attn package), then flex attention, then causal SDPA per sample.
# "dense" is the quadratic reference and comes last, so "auto" never takes it.
_PREFERENCE: tuple[AttentionPath, ...] = ("varlen", "flash", "flex", "per_sample", "dense")
assert sorted(_PREFERENCE) == sorted(ATTENTION_PATHS)

_HALF = (torch.bfloat16, torch.float16)
_VARLEN_SINCE = (2, 10)  # torch.nn.attention.varlen first shipped in torch 2.10
_FLEX_MIN_HEAD_DIM = 16  # inductor's flex attention kernel refuses smaller heads on CUDA
_FLASH_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class AttentionRuntime:
    """Everything that decides which attention paths can run."""

    device_type: str  # "cuda", "cpu", ...
    dtype: torch.dtype  # what query, key and value are computed in: the model's dtype
    torch_version: tuple[int, int]
    flash_attn_installed: bool = False
    head_dim: int | None = None  # None: not known, not checked

    @classmethod
    def detect(
        cls, device: torch.device | str, dtype: torch.dtype, head_dim: int | None = None
    ) -> AttentionRuntime:
        """This machine's torch and packages, for `device`, `dtype` and `head_dim`."""
        return cls(
            device_type=torch.device(device).type,
            dtype=dtype,
            torch_version=torch_release(torch.__version__),
            flash_attn_installed=importlib.util.find_spec("flash_attn") is not None,
            head_dim=head_dim,
        )

    @classmethod
    def of_model(cls, model: nn.Module, device: torch.device | str) -> AttentionRuntime:
        return cls.detect(device, _model_dtype(model), _model_head_dim(model))


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: "2.11.0+cu128" -> (2, 11)."""
    match = re.match(r"(\d+)\.(\d+)", str(version))
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match[1]), int(match[2])


def why_attention_cannot_run(path: AttentionPath, runtime: AttentionRuntime) -> str | None:
    """Why `path` cannot run in `runtime`, with what would let it; None when it can."""
    cuda = runtime.device_type == "cuda"
    head_dim = runtime.head_dim
    dtype = str(runtime.dtype).removeprefix("torch.")
    if path in ("varlen", "flash"):
        if not cuda:
            return "FlashAttention's kernels need a CUDA device"
        if path == "varlen" and runtime.torch_version < _VARLEN_SINCE:
            have = ".".join(map(str, runtime.torch_version))
            return f"torch.nn.attention.varlen needs torch >= 2.10 and this is torch {have}"
        if path == "flash" and not runtime.flash_attn_installed:
            return "the flash-attn package is not installed (pip install flash-attn)"
        if runtime.dtype not in _HALF:
            return (
                f"FlashAttention-2 kernels take bfloat16 or float16 only and the model is "
                f'{dtype} (set trainer.dtype = "bfloat16")'
            )
        if head_dim is not None and head_dim > _FLASH_MAX_HEAD_DIM:
            return f"FlashAttention-2 takes heads of at most 256 and this model's are {head_dim}"
        if path == "varlen" and head_dim is not None and head_dim % 8:
            # torch's varlen kernel, unlike the flash-attn package, does not pad the heads.
            return f"torch's varlen kernel needs a head size divisible by 8, not {head_dim}"
    if path == "flex":
        if not cuda:
            return "flex attention has no backward on this device (only on CUDA)"
        if head_dim is not None and head_dim < _FLEX_MIN_HEAD_DIM:
            return f"the flex kernel needs heads of at least 16 and this model's are {head_dim}"
    return None


def available_attention_paths(runtime: AttentionRuntime) -> list[AttentionPath]:
    """The paths that can run in `runtime`, fastest first (what "auto" takes the first of)."""
    return [path for path in _PREFERENCE if why_attention_cannot_run(path, runtime) is None]


def resolve_attention(choice: AttentionChoice, runtime: AttentionRuntime) -> AttentionPath:
    """The path `choice` means in `runtime`; a path that cannot run there is a clear error."""
    available = available_attention_paths(runtime)
    if choice == "auto":
        return available[0]
    reason = why_attention_cannot_run(choice, runtime)
    if reason is not None:
        raise ValueError(
            f"trainer.attention = {choice!r} cannot run on {runtime.device_type} here: "
            f'{reason}. Set trainer.attention = "auto" (here: {available[0]!r}) or one of '
            f"{', '.join(repr(path) for path in available)}"
        )
    return choice


def _model_dtype(model: nn.Module) -> torch.dtype:
    # The base weights' dtype is what attention computes in; adapters may be kept wider.
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        return embeddings.weight.dtype
    return next(model.parameters()).dtype


def _model_head_dim(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    return hidden // heads if heads and hidden else None
