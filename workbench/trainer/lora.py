"""The multi-adapter LoRA layer: one frozen base linear, one LoRA adapter slot per run.

A packed micro-batch holds the tokens of several runs, contiguous per run in slot order;
`lora_num_tokens[i]` says how many tokens belong to slot `i` (zero for a slot with no data
in this micro-batch). Each token goes through the base weight and through its own run's
adapter only:

    y = x W^T + (alpha_i / r_i) * (x A_i^T) B_i^T        for the tokens of run i

which is peft's LoRA (`lora_B(lora_A(x)) * scaling`) with one adapter per run.

How the counts reach the layers: Hugging Face models do not pass extra arguments down to
their linears, so every `MultiLoRALinear` of a model shares one `LoRARouting` object and
the training loop sets it before each forward with `set_lora_num_tokens(model, counts)`.

Two ways to compute the adapters, numerically the same:
- "grouped": one `torch._grouped_mm` per matmul over all runs (forward and backward), so
  there is no Python loop over runs and no host sync on the hot path. It also runs on CPU,
  where torch's own autograd for it fails, hence the hand-written backward below.
- "plain": a loop over each run's slice of tokens with ordinary matmuls; correct anywhere.
"auto" takes "grouped" where a one-time probe shows it works for the device and dtype and
the shapes meet its alignment rule, else "plain".

Each run may ask for a smaller rank than the slot (`set_adapter_config`): the unused rows of
A and columns of B are kept at zero and masked out of the forward, so they never receive a
gradient; the state dict cuts them off, so a run's adapter is an ordinary rank-r_i peft one.
"""

from __future__ import annotations

import functools
import logging
import math
import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import LORA_TARGET_MODULES, OrchestratorConfig, lora_rank_problem

if TYPE_CHECKING:
    from workbench.runs import MultiRunManager

logger = logging.getLogger(__name__)

LoRAPath = Literal["auto", "grouped", "plain"]

DEFAULT_TARGET_MODULES = LORA_TARGET_MODULES

_ROUTING_ATTRIBUTE = "_workbench_lora_routing"


# ---------------------------------------------------------------------------- routing


class LoRARouting:
    """Which tokens of the current micro-batch belong to which adapter slot.

    One object per model, shared by all its `MultiLoRALinear` layers, so the counts are
    converted (host list, device offsets) once per micro-batch rather than once per layer.
    """

    def __init__(self, n_adapters: int):
        self.n_adapters = n_adapters
        self.num_tokens: torch.Tensor | None = None
        self.host_counts: list[int] = []
        self.total_tokens = 0
        self._offsets_by_device: dict[torch.device, torch.Tensor] = {}

    def set_num_tokens(self, lora_num_tokens: torch.Tensor | Sequence[int]) -> None:
        counts = torch.as_tensor(lora_num_tokens, dtype=torch.long)
        if counts.ndim != 1 or counts.numel() != self.n_adapters:
            raise ValueError(
                f"lora_num_tokens must have one count per adapter slot ({self.n_adapters}), "
                f"got shape {tuple(counts.shape)}"
            )
        # One host sync per micro-batch: the plain path and the size check need the counts.
        host_counts = counts.tolist()
        if min(host_counts) < 0:
            raise ValueError(f"lora_num_tokens must be non-negative, got {host_counts}")
        self.num_tokens = counts
        self.host_counts = host_counts
        self.total_tokens = sum(host_counts)
        self._offsets_by_device = {}

    def offsets(self, device: torch.device) -> torch.Tensor:
        """Cumulative end of each slot's tokens (int32), as `torch._grouped_mm` wants them."""
        if self.num_tokens is None:
            raise RuntimeError("no token counts set; call set_lora_num_tokens(model, counts)")
        offsets = self._offsets_by_device.get(device)
        if offsets is None:
            offsets = torch.cumsum(self.num_tokens, 0).to(device=device, dtype=torch.int32)
            self._offsets_by_device[device] = offsets
        return offsets


def set_lora_num_tokens(model: nn.Module, lora_num_tokens: torch.Tensor | Sequence[int]) -> None:
    """Route the next forward: the first `lora_num_tokens[0]` tokens to slot 0, and so on.

    Keep the counts set until the backward pass has finished: activation checkpointing
    recomputes the forward during backward and reads them again.
    """
    get_lora_routing(model).set_num_tokens(lora_num_tokens)


def get_lora_routing(model: nn.Module) -> LoRARouting:
    routing = getattr(model, _ROUTING_ATTRIBUTE, None)
    if routing is None:
        raise RuntimeError("this model has no multi-LoRA layers; call apply_lora_to_model first")
    return routing


# ---------------------------------------------------------------------------- grouped matmul


class _GroupedLoRA(torch.autograd.Function):
    """`x -> (x A_g^T) B_g^T` per token group g, forward and backward as grouped matmuls.

    Written out because torch's autograd formula for `_grouped_mm` fails on CPU (torch 2.13);
    the four backward products are grouped matmuls too, so nothing loops over runs.
    """

    @staticmethod
    def forward(ctx, x, lora_a, scaled_lora_b, offsets):  # type: ignore[override]
        hidden = torch._grouped_mm(x, lora_a.transpose(1, 2), offsets)
        out = torch._grouped_mm(hidden, scaled_lora_b.transpose(1, 2), offsets)
        ctx.save_for_backward(x, lora_a, scaled_lora_b, hidden, offsets)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, lora_a, scaled_lora_b, hidden, offsets = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_hidden = torch._grouped_mm(grad_out, scaled_lora_b, offsets)
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch._grouped_mm(grad_hidden, lora_a, offsets)
        if ctx.needs_input_grad[1]:
            grad_a = torch._grouped_mm(grad_hidden.t(), x, offsets)
        if ctx.needs_input_grad[2]:
            grad_b = torch._grouped_mm(grad_out.t(), hidden, offsets)
        return grad_x, grad_a, grad_b, None


def _grouped_lora(x, lora_a, scaled_lora_b, offsets) -> torch.Tensor:
    if x.dtype != torch.bfloat16 and torch.compiler.is_compiling():
        # torch.compile's shape propagation for _grouped_mm accepts bfloat16 only (torch
        # 2.13), while the eager CPU kernel takes float32 too: run this op outside the graph.
        return _grouped_lora_outside_graph(x, lora_a, scaled_lora_b, offsets)
    return _GroupedLoRA.apply(x, lora_a, scaled_lora_b, offsets)


@torch.compiler.disable
def _grouped_lora_outside_graph(x, lora_a, scaled_lora_b, offsets) -> torch.Tensor:
    return _GroupedLoRA.apply(x, lora_a, scaled_lora_b, offsets)


def _looped_lora(x, lora_a, scaled_lora_b, counts: list[int]) -> torch.Tensor:
    """Reference for the probe: the same product, one group at a time."""
    return torch.cat(
        [
            F.linear(F.linear(part, a), b)
            for part, a, b in zip(x.split(counts), lora_a, scaled_lora_b, strict=True)
        ]
    )


@functools.cache
def grouped_mm_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the grouped path works here: a small forward and backward checked against a loop.

    Probed once per device type and dtype, because which devices and dtypes
    `torch._grouped_mm` accepts has changed between torch releases.
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    device = torch.device(device_type)
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
        return _probe_grouped_mm(device, dtype, counts, tensors, offsets)


def _keep(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _probe_grouped_mm(device, dtype, counts, tensors, offsets) -> bool:
    try:
        grouped = [t.to(device, dtype).clone().requires_grad_() for t in tensors]
        looped = [t.to(device, dtype).clone().requires_grad_() for t in tensors]
        out_grouped = _grouped_lora(*grouped, offsets)
        out_looped = _looped_lora(*looped, counts)
        (out_grouped.float() ** 2).sum().backward()
        (out_looped.float() ** 2).sum().backward()
        tolerance = 1e-4 if dtype == torch.float32 else 5e-2
        pairs = [(out_grouped, out_looped)] + [
            (g.grad, r.grad) for g, r in zip(grouped, looped, strict=True)
        ]
        return all(
            torch.allclose(a.float(), b.float(), rtol=tolerance, atol=tolerance) for a, b in pairs
        )
    except Exception as err:  # any failure means "not here": the plain path always works
        logger.info("grouped LoRA matmul unavailable on %s/%s: %s", device.type, dtype, err)
        return False


# ---------------------------------------------------------------------------- the layer


class MultiLoRALinear(nn.Module):
    """A frozen `nn.Linear` plus `n_adapters` LoRA slots, tokens routed by per-slot counts.

    Per-slot parameters are separate leaves (`lora_A[i]`, `lora_B[i]` in ParameterLists)
    rather than one stacked tensor: each run's optimizer then owns exactly its own tensors,
    its gradient norm and weight decay see only them, and dropping a run drops nothing
    shared. The stacking the grouped path needs happens inside forward; for LoRA ranks it
    copies a few kilobytes per layer, and autograd splits the gradient back per slot.
    """

    def __init__(
        self,
        base_layer: nn.Linear,
        rank: int,
        n_adapters: int,
        alpha: float,
        *,
        path: LoRAPath = "auto",
        routing: LoRARouting | None = None,
        dtype: torch.dtype | None = None,
        name: str = "",
    ):
        super().__init__()
        if rank < 1 or n_adapters < 1:
            raise ValueError(f"rank and n_adapters must be at least 1, got {rank}, {n_adapters}")
        if alpha <= 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        if routing is not None and routing.n_adapters != n_adapters:
            raise ValueError(
                f"routing has {routing.n_adapters} slots but the layer has {n_adapters}"
            )
        self.base_layer = base_layer
        self.base_layer.requires_grad_(False)
        self.in_features = base_layer.in_features
        self.out_features = base_layer.out_features
        self.rank = rank
        self.n_adapters = n_adapters
        self.alpha = alpha
        self.path: LoRAPath = path
        self.routing = routing if routing is not None else LoRARouting(n_adapters)
        self.name = name

        factory = {"device": base_layer.weight.device, "dtype": dtype or base_layer.weight.dtype}
        self.lora_A = nn.ParameterList(
            nn.Parameter(torch.empty(rank, self.in_features, **factory)) for _ in range(n_adapters)
        )
        self.lora_B = nn.ParameterList(
            nn.Parameter(torch.empty(self.out_features, rank, **factory)) for _ in range(n_adapters)
        )
        self._adapter_rank = [rank] * n_adapters
        self._adapter_alpha = [alpha] * n_adapters
        self._adapter_seed: list[int | None] = [None] * n_adapters
        # Column i, j of B is multiplied by alpha_i / r_i for j < r_i and by 0 beyond: the
        # per-run scaling and the smaller-rank mask in one multiply on the grouped path.
        self.register_buffer(
            "rank_scaling",
            torch.full((n_adapters, rank), alpha / rank, device=factory["device"]),
            persistent=False,
        )
        for idx in range(n_adapters):
            self.reset_parameters_for_adapter(idx)

    # ------------------------------------------------------------------ nn.Linear look-alike

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    def extra_repr(self) -> str:
        return (
            f"rank={self.rank}, n_adapters={self.n_adapters}, alpha={self.alpha}, path={self.path}"
        )

    # ------------------------------------------------------------------ per-run settings

    def set_adapter_config(
        self, idx: int, rank: int, alpha: float, seed: int | None = None
    ) -> None:
        """Give slot `idx` its run's rank (at most the slot's) and alpha, and its init seed.

        With a seed, resets draw A from a generator seeded by (seed, layer name), so a run's
        initial adapter does not depend on its slot or on which other runs exist.
        """
        self._check_idx(idx)
        if not 1 <= rank <= self.rank:
            raise ValueError(f"adapter rank must be in 1..{self.rank} (the slot rank), got {rank}")
        if alpha <= 0:
            raise ValueError(f"alpha must be positive, got {alpha}")
        self._adapter_rank[idx] = rank
        self._adapter_alpha[idx] = alpha
        self._adapter_seed[idx] = seed
        with torch.no_grad():
            self.rank_scaling[idx].zero_()
            self.rank_scaling[idx, :rank] = alpha / rank
            self.lora_A[idx][rank:].zero_()
            self.lora_B[idx][:, rank:].zero_()

    def adapter_rank(self, idx: int) -> int:
        return self._adapter_rank[idx]

    def adapter_alpha(self, idx: int) -> float:
        return self._adapter_alpha[idx]

    def adapter_scaling(self, idx: int) -> float:
        return self._adapter_alpha[idx] / self._adapter_rank[idx]

    # ------------------------------------------------------------------ the LoRAModule protocol

    def named_parameters_for_adapter(self, idx: int) -> Iterator[tuple[str, nn.Parameter]]:
        self._check_idx(idx)
        yield "lora_A", self.lora_A[idx]
        yield "lora_B", self.lora_B[idx]

    def state_dict_for_adapter(self, idx: int) -> dict[str, torch.Tensor]:
        """peft-named tensors of slot `idx`, cut to the run's rank: A [r, in], B [out, r]."""
        self._check_idx(idx)
        rank = self._adapter_rank[idx]
        return {
            "lora_A.weight": self.lora_A[idx][:rank].detach().clone().contiguous(),
            "lora_B.weight": self.lora_B[idx][:, :rank].detach().clone().contiguous(),
        }

    def load_state_dict_for_adapter(self, idx: int, state: dict[str, torch.Tensor]) -> None:
        """Inverse of `state_dict_for_adapter`: a run-rank adapter into slot `idx`; the rank
        must match the run's. (Resuming loads the whole slot instead: `trainer/checkpoint.py`.)"""
        self._check_idx(idx)
        rank = self._adapter_rank[idx]
        lora_a, lora_b = state["lora_A.weight"], state["lora_B.weight"]
        expected_a, expected_b = (rank, self.in_features), (self.out_features, rank)
        if tuple(lora_a.shape) != expected_a or tuple(lora_b.shape) != expected_b:
            raise ValueError(
                f"{self.name or 'layer'} slot {idx}: expected lora_A {expected_a} and lora_B "
                f"{expected_b} (run rank {rank}), got {tuple(lora_a.shape)} and "
                f"{tuple(lora_b.shape)}"
            )
        with torch.no_grad():
            self.lora_A[idx].zero_()
            self.lora_B[idx].zero_()
            self.lora_A[idx][:rank].copy_(lora_a)
            self.lora_B[idx][:, :rank].copy_(lora_b)

    def reset_parameters_for_adapter(self, idx: int) -> None:
        """peft's initialisation: A kaiming-uniform (a = sqrt(5)), B zero; padding rows zero."""
        self._check_idx(idx)
        lora_a = self.lora_A[idx]
        seed = self._adapter_seed[idx]
        with torch.no_grad():
            if seed is None:
                nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5))
            else:
                # Drawn on the CPU so the same seed gives the same adapter on any device.
                generator = torch.Generator().manual_seed(_layer_seed(seed, self.name))
                initial = torch.empty(lora_a.shape, dtype=lora_a.dtype)
                nn.init.kaiming_uniform_(initial, a=math.sqrt(5), generator=generator)
                lora_a.copy_(initial)
            lora_a[self._adapter_rank[idx] :].zero_()
            self.lora_B[idx].zero_()
            lora_a.grad = None
            self.lora_B[idx].grad = None

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        routing = self.routing
        flat = x.reshape(-1, self.in_features)
        if routing.num_tokens is None:
            raise RuntimeError(
                f"{self.name or 'MultiLoRALinear'}: no token counts set; call "
                "set_lora_num_tokens(model, counts) before the forward"
            )
        if routing.total_tokens != flat.shape[0]:
            raise ValueError(
                f"{self.name or 'MultiLoRALinear'}: lora_num_tokens sums to "
                f"{routing.total_tokens} but the input has {flat.shape[0]} tokens"
            )
        if flat.shape[0] == 0:
            return result
        lora_dtype = self.lora_A[0].dtype
        flat = flat.to(lora_dtype)
        if self.resolve_path(flat) == "grouped":
            delta = self._grouped_forward(flat)
        else:
            delta = self._plain_forward(flat)
        return result + delta.view(result.shape).to(result.dtype)

    def resolve_path(self, flat: torch.Tensor) -> Literal["grouped", "plain"]:
        """The path this input takes: the forced one, or for "auto" the grouped one if usable."""
        if self.path != "auto":
            return self.path
        if not grouped_mm_supported(flat.device.type, flat.dtype):
            return "plain"
        # grouped_mm wants 16-byte aligned rows for every operand, transposed ones included.
        itemsize = flat.element_size()
        aligned = all(
            (size * itemsize) % 16 == 0 for size in (self.in_features, self.out_features, self.rank)
        )
        return "grouped" if aligned else "plain"

    def _grouped_forward(self, flat: torch.Tensor) -> torch.Tensor:
        flat = flat.contiguous()
        if flat.data_ptr() % 16:
            flat = flat.clone()
        lora_a = torch.stack(tuple(self.lora_A))
        scaled_lora_b = torch.stack(tuple(self.lora_B)) * self.rank_scaling.to(flat.dtype)[:, None]
        return _grouped_lora(flat, lora_a, scaled_lora_b, self.routing.offsets(flat.device))

    def _plain_forward(self, flat: torch.Tensor) -> torch.Tensor:
        parts = []
        for idx, part in enumerate(flat.split(self.routing.host_counts)):
            if part.shape[0] == 0:
                continue
            rank = self._adapter_rank[idx]
            lora_a = self.lora_A[idx][:rank]
            lora_b = self.lora_B[idx][:, :rank]
            parts.append(F.linear(F.linear(part, lora_a), lora_b) * self.adapter_scaling(idx))
        return torch.cat(parts)

    def _check_idx(self, idx: int) -> None:
        if not 0 <= idx < self.n_adapters:
            raise IndexError(f"adapter index {idx} is outside 0..{self.n_adapters - 1}")


def _layer_seed(seed: int, layer_name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(layer_name.encode())) % (2**63)


# ---------------------------------------------------------------------------- the model


def resolve_run_lora(config: OrchestratorConfig, rank: int, alpha: float) -> tuple[int, float]:
    """A run's (rank, alpha): its own `[lora]` settings, else the trainer's."""
    return config.lora.rank or rank, config.lora.alpha or alpha


def apply_lora_to_model(
    model: nn.Module,
    manager: MultiRunManager,
    rank: int,
    alpha: float,
    target_modules: Sequence[str] = DEFAULT_TARGET_MODULES,
    *,
    path: LoRAPath = "auto",
) -> list[str]:
    """Wrap the model's target linears in `MultiLoRALinear`, freeze the rest, register them.

    A linear is a target when the last part of its module path is in `target_modules`
    (`model.layers.0.self_attn.q_proj` for "q_proj"). Each wrapped layer is registered with
    the manager under that path, so a run's state dict has keys such as
    `model.layers.0.self_attn.q_proj.lora_A.weight` (peft's names without its
    `base_model.model.` prefix). Also registers with the manager: a config validation hook
    (a run may not ask for more than `rank`), a creation hook that gives each new run its
    rank, alpha and seeded initial adapter, and a deletion hook that clears them.

    Returns the wrapped module paths.
    """
    if getattr(model, _ROUTING_ATTRIBUTE, None) is not None:
        raise RuntimeError("apply_lora_to_model was already applied to this model")
    targets = set(target_modules)
    routing = LoRARouting(manager.max_runs)
    model.requires_grad_(False)
    layers: dict[str, MultiLoRALinear] = {}
    for module_name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or module_name.rsplit(".", 1)[-1] not in targets:
            continue
        parent_name, _, child_name = module_name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = MultiLoRALinear(
            module, rank, manager.max_runs, alpha, path=path, routing=routing, name=module_name
        )
        setattr(parent, child_name, layer)
        layers[module_name] = layer
    if not layers:
        linears = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, m in model.named_modules()
                if isinstance(m, nn.Linear)
            }
        )
        raise ValueError(
            f"no linear layer of the model matches target_modules {sorted(targets)}; "
            f"its linear layers are named {linears}"
        )
    for module_name, layer in layers.items():
        manager.register_lora_module(module_name, layer)
    if path != "plain":
        # Probe the grouped matmul now rather than in the first forward (see the probe).
        sample = next(iter(layers.values()))
        grouped_mm_supported(sample.weight.device.type, sample.lora_A[0].dtype)
    setattr(model, _ROUTING_ATTRIBUTE, routing)

    def validate_run_rank(config: OrchestratorConfig) -> tuple[bool, str]:
        problem = lora_rank_problem(config.lora.rank, rank)
        return problem is None, f"lora.rank: {problem}" if problem else ""

    def configure_new_run(idx: int, run_id: str) -> None:
        config = manager.config[idx]
        run_rank, run_alpha = resolve_run_lora(config, rank, alpha)
        for layer in layers.values():
            layer.set_adapter_config(idx, run_rank, run_alpha, seed=config.seed)
            layer.reset_parameters_for_adapter(idx)

    def clear_deleted_run(idx: int, run_id: str) -> None:
        for layer in layers.values():
            layer.set_adapter_config(idx, rank, alpha, seed=None)

    manager.register_config_validation_hook(validate_run_rank)
    manager.register_creation_hook(configure_new_run)
    manager.register_deletion_hook(clear_deleted_run)
    # Runs admitted before the layers existed were reset by nobody: configure them now.
    for idx in manager.used_idxs:
        configure_new_run(idx, manager.idx_2_id[idx])
    return list(layers)
