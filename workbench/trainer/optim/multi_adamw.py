"""Every ready run's gradient clipping and AdamW step at once, instead of one run after another.

Each run keeps its own `torch.optim.AdamW` (its settings, its schedule's learning rate, its
state and checkpoint format are unchanged); these functions only compute what the runs'
`clip_grad_norm_` and `AdamW.step()` would, over all runs' tensors together with `torch._foreach_*`
ops whose per-tensor scalars carry each run's own settings. With N runs that is a handful of
foreach calls for all of them rather than N sets (on a GPU, N times the kernel launches); on
the CPU one loop over every run's tensors instead of N optimizers' steps, each with its own
overhead (at 32 runs of the built-in model, 172 ms of a 1.3 s update were the 32 AdamW
steps). The results are the same, bit for bit, as the per-run
calls (tests/trainer/test_multi_adamw.py): the same elementwise operations in the same order
with the same scalars, as torch's own single- and multi-tensor AdamW.

An optimizer with options these functions do not compute (amsgrad, maximize, capturable,
differentiable, fused, a Tensor learning rate) steps on its own, as before. The trainer's
runs on the CPU are such: fused (`optim.fused_on`), since at 64 runs these eight foreach
operations over every run's small tensors cost more than each run's one fused pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.optim import AdamW

# On the CPU, foreach ops pay off for small tensors, where a step is overhead, and lose for
# large ones, which each op streams through memory again (`scripts/optimizer_step_bench.py`,
# one thread, optimizer-step-20261127T081403.json): the built-in model's rank-8 adapters
# (1,024 and 3,072 elements a tensor), 32 runs, 0.142 s against the runs' own steps' 0.185 s;
# Qwen3-0.6B-shaped rank 16 (16,384 to 49,152), 8 runs, 0.91 s against 0.71 s.
CPU_FOREACH_MAX_NUMEL = 8192
# AdamW options that must have these values for the joint step to compute what AdamW does.
PLAIN_ADAMW = {
    "amsgrad": False,
    "maximize": False,
    "capturable": False,
    "differentiable": False,
    "fused": None,
}


@torch.no_grad()
def clip_grad_norms_together(
    params_by_run: dict[int, list[torch.Tensor]], max_norms: dict[int, float]
) -> dict[int, float]:
    """Clip each run's gradients to its own `max_norms[run]`, as
    `torch.nn.utils.clip_grad_norm_` would run by run; return each run's norm before.

    The per-tensor norms are taken in one `_foreach_norm` over every run's gradients, and
    read in one host sync; each run's coefficient is computed as clip_grad_norm_ computes it
    (float32, on the device) and applied in one `_foreach_mul_`."""
    grads_by_run = {
        run: [param.grad for param in params if param.grad is not None]
        for run, params in params_by_run.items()
    }
    flat = [grad for grads in grads_by_run.values() for grad in grads]
    norms: dict[int, torch.Tensor] = {}
    if flat:
        per_tensor = torch._foreach_norm(flat, 2.0)
        start = 0
        for run, grads in grads_by_run.items():
            own = per_tensor[start : start + len(grads)]
            start += len(grads)
            if own:
                norms[run] = torch.linalg.vector_norm(torch.stack(own), 2.0)
    for run in grads_by_run:
        if run not in norms:
            norms[run] = torch.tensor(0.0)
    coefficients = {
        run: torch.clamp(max_norms[run] / (norm + 1e-6), max=1.0) for run, norm in norms.items()
    }
    # One host sync for the norms and coefficients of every run.
    values = torch.stack([norms[run] for run in grads_by_run]).tolist()
    scales = torch.stack([coefficients[run].to(norms[run].dtype) for run in grads_by_run]).tolist()
    scaled, factors = [], []
    for run, scale in zip(grads_by_run, scales, strict=True):
        if scale == 1.0:
            # A run within its max_norm: times 1.0 is the same tensor, bit for bit, and
            # multiplying every small tensor costs ~10 ms an update at 64 runs on the CPU.
            continue
        scaled += grads_by_run[run]
        factors += [scale] * len(grads_by_run[run])
    if scaled:
        torch._foreach_mul_(scaled, factors)
    return dict(zip(grads_by_run, values, strict=True))


def steps_together(optimizer: AdamW) -> bool:
    """Whether `adamw_step_together` computes what `optimizer.step()` would."""
    return all(
        all(group.get(key, value) == value for key, value in PLAIN_ADAMW.items())
        and group.get("decoupled_weight_decay", True)
        and not isinstance(group["lr"], torch.Tensor)
        for group in optimizer.param_groups
    )


@torch.no_grad()
def adamw_step_together(optimizers: list[AdamW], foreach: bool | None = None) -> None:
    """Step every optimizer (each `steps_together`) as its `step()` would, all at once.

    The math of torch's AdamW without amsgrad (`torch.optim.adam._single_tensor_adam`, which
    the CPU runs, and `_multi_tensor_adam`, which CUDA runs): step += 1; the weight decayed
    by 1 - lr * weight_decay; exp_avg lerped to the gradient by 1 - beta1; exp_avg_sq times
    beta2 plus (1 - beta2) g^2; the parameter moved by -lr / (1 - beta1^step) times exp_avg
    over sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps. Parameters without a gradient are
    skipped, and state is made on a parameter's first step, as AdamW makes it.

    `foreach`: each operation over every tensor at once. By default on a GPU, and on the
    CPU for small tensors (`CPU_FOREACH_MAX_NUMEL`); larger ones on the CPU go through all
    their operations one tensor at a time, while in cache, as torch's AdamW does there."""
    operands = _operands(optimizers)
    if not operands.params:
        return
    if foreach is None:
        params = operands.params
        mean_numel = sum(param.numel() for param in params) / len(params)
        foreach = params[0].device.type != "cpu" or mean_numel <= CPU_FOREACH_MAX_NUMEL
    if foreach:
        _step_foreach(operands)
    else:
        _step_one_tensor_at_a_time(operands)


@dataclass
class _Operands:
    """Every parameter to step, its gradient and moments, and the scalars of its group at
    its step, in one order: what both ways of stepping take."""

    params: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    exp_avgs: list[torch.Tensor] = field(default_factory=list)
    exp_avg_sqs: list[torch.Tensor] = field(default_factory=list)
    decay: list[float] = field(default_factory=list)  # 1 - lr * weight_decay
    lerp: list[float] = field(default_factory=list)  # 1 - beta1
    beta2s: list[float] = field(default_factory=list)
    square_weights: list[float] = field(default_factory=list)  # 1 - beta2
    bias2_roots: list[float] = field(default_factory=list)  # sqrt(1 - beta2^step)
    epsilons: list[float] = field(default_factory=list)
    step_sizes: list[float] = field(default_factory=list)  # -lr / (1 - beta1^step)


def _operands(optimizers: list[AdamW]) -> _Operands:
    """Each parameter with a gradient, its step counted (state made on its first, as AdamW
    makes it), with its moments and its group's scalars."""
    operands = _Operands()
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            lr, weight_decay, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = optimizer.state[param]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=torch.get_default_dtype())
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(
                        param, memory_format=torch.preserve_format
                    )
                state["step"] += 1
                step = state["step"].item()  # on the host, as AdamW keeps it: no sync
                operands.params.append(param)
                operands.grads.append(param.grad)
                operands.exp_avgs.append(state["exp_avg"])
                operands.exp_avg_sqs.append(state["exp_avg_sq"])
                operands.decay.append(1 - lr * weight_decay)
                operands.lerp.append(1 - beta1)
                operands.beta2s.append(beta2)
                operands.square_weights.append(1 - beta2)
                operands.bias2_roots.append((1 - beta2**step) ** 0.5)
                operands.epsilons.append(eps)
                operands.step_sizes.append(-(lr / (1 - beta1**step)))
    return operands


def _step_one_tensor_at_a_time(o: _Operands) -> None:
    """All of one tensor's operations while it is in cache, as torch's AdamW on the CPU."""
    for param, grad, exp_avg, exp_avg_sq, d, w, b2, sw, root, eps, size in zip(
        o.params, o.grads, o.exp_avgs, o.exp_avg_sqs, o.decay, o.lerp, o.beta2s,
        o.square_weights, o.bias2_roots, o.epsilons, o.step_sizes, strict=True,
    ):  # fmt: skip
        if d != 1:
            param.mul_(d)
        exp_avg.lerp_(grad, w)
        exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=sw)
        param.addcdiv_(exp_avg, (exp_avg_sq.sqrt() / root).add_(eps), value=size)


def _step_foreach(o: _Operands) -> None:
    """Each operation over every tensor at once, as torch's multi-tensor AdamW."""
    decayed = [(p, d) for p, d in zip(o.params, o.decay, strict=True) if d != 1]
    if decayed:  # AdamW multiplies only where weight_decay != 0
        torch._foreach_mul_([p for p, _ in decayed], [d for _, d in decayed])
    torch._foreach_lerp_(o.exp_avgs, o.grads, o.lerp)
    torch._foreach_mul_(o.exp_avg_sqs, o.beta2s)
    torch._foreach_addcmul_(o.exp_avg_sqs, o.grads, o.grads, o.square_weights)
    denominators = torch._foreach_sqrt(o.exp_avg_sqs)
    torch._foreach_div_(denominators, o.bias2_roots)
    torch._foreach_add_(denominators, o.epsilons)
    torch._foreach_addcdiv_(o.params, o.exp_avgs, denominators, o.step_sizes)
