"""The multi-run LoRA product as one torch op, and which kernel runs it on this device.

    delta_g = (x_g A_g^T) B_g^T        for the rows x_g of run g (contiguous, in run order)

`multi_lora(x, lora_a, scaled_lora_b, offsets, grouped_mm)` computes it for every run at
once, forward and backward. Under torch.compile it is a `torch.library` custom op, kept
whole in the graph: nothing in it is traced, so the graph neither breaks on it nor
specialises on how many tokens each run has (the offsets are a tensor), whatever the dtype
(torch's own shape function for `_grouped_mm` accepts bfloat16 only, torch 2.13). In
eager mode the same kernels run under an autograd Function, which costs less per call.

Two kernels, numerically the same:
- `grouped_mm=True`: `torch._grouped_mm`, offsets on x's device; one kernel per product.
- `grouped_mm=False`: our loop over the runs, offsets on the host, so reading them costs
  no sync. Used where `torch._grouped_mm` would run its own fallback, which loops too but
  first copies the offsets to the host (`offs.cpu()`): a host sync in every LoRA layer.

(No `from __future__ import annotations` here: `custom_op` reads the annotations.)
"""

import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- kernels


def _rows_by_group(a: Tensor, b: Tensor, offsets: Tensor, grouped_mm: bool) -> Tensor:
    """[T, k] x [G, k, n] -> [T, n]: the rows of group g times b[g]."""
    if grouped_mm:
        return torch._grouped_mm(_aligned(a), b, offsets)
    out = a.new_empty(a.shape[0], b.shape[-1])
    start = 0
    for group, end in enumerate(offsets.tolist()):  # host offsets: no sync
        if end > start:
            torch.mm(a[start:end], b[group], out=out[start:end])
        start = end
    return out


def _sum_by_group(a: Tensor, b: Tensor, offsets: Tensor, grouped_mm: bool) -> Tensor:
    """[k, T] x [T, n] -> [G, k, n]: for each group g, its columns of a times its rows of b."""
    if grouped_mm:
        return torch._grouped_mm(_aligned(a), _aligned(b), offsets)
    ends = offsets.tolist()
    out = a.new_zeros(len(ends), a.shape[0], b.shape[1])
    start = 0
    for group, end in enumerate(ends):
        if end > start:
            torch.mm(a[:, start:end], b[start:end], out=out[group])
        start = end
    return out


def _aligned(tensor: Tensor) -> Tensor:
    # torch._grouped_mm on CUDA wants every operand's data 16-byte aligned; a view that
    # starts mid-allocation is copied. (Inside this op nothing is traced, so this check costs
    # torch.compile nothing.)
    if tensor.data_ptr() % 16:
        return tensor.clone()
    return tensor


# ---------------------------------------------------------------------------- the op


def _forward(x, lora_a, scaled_lora_b, offsets, grouped_mm):
    hidden = _rows_by_group(x, lora_a.transpose(1, 2), offsets, grouped_mm)
    return _rows_by_group(hidden, scaled_lora_b.transpose(1, 2), offsets, grouped_mm), hidden


def _backward(grad_out, x, lora_a, scaled_lora_b, hidden, offsets, grouped_mm, needs_grad_x):
    grad_out = grad_out.contiguous()
    grad_hidden = _rows_by_group(grad_out, scaled_lora_b, offsets, grouped_mm)
    grad_x = _rows_by_group(grad_hidden, lora_a, offsets, grouped_mm) if needs_grad_x else None
    grad_a = _sum_by_group(grad_hidden.t(), x, offsets, grouped_mm)
    grad_b = _sum_by_group(grad_out.t(), hidden, offsets, grouped_mm)
    return grad_x, grad_a, grad_b


class _MultiLoRA(torch.autograd.Function):
    """Eager mode: the kernels under a plain autograd Function. Through the dispatcher, as
    the custom op goes, a forward and backward cost about 0.1 ms more (measured on the CPU,
    torch 2.13): some 20 ms per row in eager mode for a 28-layer model's 196 LoRA layers."""

    @staticmethod
    def forward(ctx, x, lora_a, scaled_lora_b, offsets, grouped_mm):  # type: ignore[override]
        out, hidden = _forward(x, lora_a, scaled_lora_b, offsets, grouped_mm)
        ctx.save_for_backward(x, lora_a, scaled_lora_b, hidden, offsets)
        ctx.grouped_mm = grouped_mm
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, lora_a, scaled_lora_b, hidden, offsets = ctx.saved_tensors
        grads = _backward(
            grad_out, x, lora_a, scaled_lora_b, hidden, offsets, ctx.grouped_mm,
            ctx.needs_input_grad[0],
        )  # fmt: skip
        return *grads, None, None


# torch.compile: the same kernels as custom ops, one opaque node each in the graph.


@torch.library.custom_op("workbench::multi_lora", mutates_args=())
def multi_lora_forward(
    x: Tensor, lora_a: Tensor, scaled_lora_b: Tensor, offsets: Tensor, grouped_mm: bool
) -> tuple[Tensor, Tensor]:
    """(delta [T, out], hidden [T, r]); x [T, in], lora_a [G, r, in], scaled_lora_b [G, out, r].

    `hidden` (x A^T) is returned for the backward, which needs it."""
    return _forward(x, lora_a, scaled_lora_b, offsets, grouped_mm)


@multi_lora_forward.register_fake
def _(x, lora_a, scaled_lora_b, offsets, grouped_mm):
    return x.new_empty(x.shape[0], scaled_lora_b.shape[1]), x.new_empty(x.shape[0], lora_a.shape[1])


@torch.library.custom_op("workbench::multi_lora_backward", mutates_args=())
def multi_lora_backward(
    grad_out: Tensor,
    x: Tensor,
    lora_a: Tensor,
    scaled_lora_b: Tensor,
    hidden: Tensor,
    offsets: Tensor,
    grouped_mm: bool,
    needs_grad_x: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_lora_a, grad_scaled_lora_b); grad_x is empty unless `needs_grad_x`."""
    grad_x, grad_a, grad_b = _backward(
        grad_out, x, lora_a, scaled_lora_b, hidden, offsets, grouped_mm, needs_grad_x
    )
    return (grad_x if grad_x is not None else x.new_empty(0)), grad_a, grad_b


@multi_lora_backward.register_fake
def _(grad_out, x, lora_a, scaled_lora_b, hidden, offsets, grouped_mm, needs_grad_x):
    grad_x = x.new_empty(x.shape) if needs_grad_x else x.new_empty(0)
    return grad_x, lora_a.new_empty(lora_a.shape), scaled_lora_b.new_empty(scaled_lora_b.shape)


def _setup_context(ctx, inputs, output):
    x, lora_a, scaled_lora_b, offsets, grouped_mm = inputs
    ctx.save_for_backward(x, lora_a, scaled_lora_b, output[1], offsets)
    ctx.grouped_mm = grouped_mm


def _custom_op_backward(ctx, grad_out, grad_hidden):
    # `hidden` is an output only so the backward has it; nothing downstream uses it.
    x, lora_a, scaled_lora_b, hidden, offsets = ctx.saved_tensors
    needs_grad_x = ctx.needs_input_grad[0]
    grad_x, grad_a, grad_b = multi_lora_backward(
        grad_out, x, lora_a, scaled_lora_b, hidden, offsets, ctx.grouped_mm, needs_grad_x
    )
    return (grad_x if needs_grad_x else None), grad_a, grad_b, None, None


multi_lora_forward.register_autograd(_custom_op_backward, setup_context=_setup_context)


def multi_lora(
    x: Tensor, lora_a: Tensor, scaled_lora_b: Tensor, offsets: Tensor, grouped_mm: bool
) -> Tensor:
    """The LoRA delta [T, out] of every run's rows; `offsets` are the cumulative row counts
    (int32), on x's device for `grouped_mm`, on the host for the per-run loop."""
    if torch.compiler.is_compiling():
        return multi_lora_forward(x, lora_a, scaled_lora_b, offsets, grouped_mm)[0]
    return _MultiLoRA.apply(x, lora_a, scaled_lora_b, offsets, grouped_mm)


# ---------------------------------------------------------------------------- which kernel


@functools.cache
def grouped_mm_problem(device_type: str, dtype: torch.dtype) -> str | None:
    """Why `torch._grouped_mm` should not carry the LoRA product here; None where it should.

    Decided once per device type and dtype. torch's `_grouped_mm_cuda` (Blas.cpp, later
    GroupedBlas.cpp; the same test in every release that has the op) runs its CUTLASS kernel
    only when both operands and the output are bfloat16 and the GPU's compute capability is
    9.x or 10.x (`_scaled_mm_allowed_device(sm90_only, sm100_only)`; on ROCm only with the
    CK kernels on gfx942/gfx950); otherwise `_grouped_mm_fallback` (ATen's
    GroupedMMUtils.h, shipped in the wheel's include/) runs `offs.cpu()` and loops over the
    groups with `mm_out`. On the CPU that same loop is the kernel, and there the offsets
    already are on the host: no sync. Where the rule allows it, a small forward and backward
    is still checked against a loop (on CUDA too), because which devices and dtypes the op
    accepts has changed between torch releases.
    """
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if device_type == "cuda":
        if torch.version.hip is not None:
            return "on ROCm torch._grouped_mm mostly runs its host-syncing fallback"
        major, minor = torch.cuda.get_device_capability()
        if dtype != torch.bfloat16 or major not in (9, 10):
            return (
                f"torch._grouped_mm has a kernel for bfloat16 on compute capability 9.x and "
                f"10.x only; with {str(dtype).removeprefix('torch.')} on "
                f"{torch.cuda.get_device_name()} (sm_{major}{minor}) it would copy the "
                "offsets to the host in every call"
            )
    return _probe(torch.device(device_type), dtype)


def _probe(device: torch.device, dtype: torch.dtype) -> str | None:
    generator = torch.Generator().manual_seed(0)
    counts = [3, 0, 5]
    tensors = [
        torch.randn(8, 16, generator=generator),
        torch.randn(3, 8, 16, generator=generator),
        torch.randn(3, 16, 8, generator=generator),
    ]
    offsets = torch.tensor(counts).cumsum(0).to(device=device, dtype=torch.int32)
    # The probe may first run inside a model's forward: under no_grad (it needs gradients),
    # or inside an activation-checkpointed layer, whose saved-tensor hooks must not count
    # the probe's tensors (the recomputation, probe cached, would save fewer and fail).
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
        try:
            grouped = [t.to(device, dtype).clone().requires_grad_() for t in tensors]
            looped = [t.to(device, dtype).clone().requires_grad_() for t in tensors]
            out_grouped = multi_lora(*grouped, offsets, True)
            out_looped = torch.cat(
                [
                    F.linear(F.linear(part, a), b)
                    for part, a, b in zip(looped[0].split(counts), *looped[1:], strict=True)
                ]
            )
            (out_grouped.float() ** 2).sum().backward()
            (out_looped.float() ** 2).sum().backward()
        except Exception as err:  # any failure means "not here": the loop always works
            return f"torch._grouped_mm fails on {device.type}/{dtype}: {err}"
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    pairs = [(out_grouped, out_looped)] + [
        (g.grad, r.grad) for g, r in zip(grouped, looped, strict=True)
    ]
    if all(torch.allclose(a.float(), b.float(), rtol=tolerance, atol=tolerance) for a, b in pairs):
        return None
    return f"torch._grouped_mm gives wrong results on {device.type}/{dtype}"


def _keep(tensor: Tensor) -> Tensor:
    return tensor
