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

Three ways to compute the adapters, numerically the same:
- "grouped": one op over all runs per LoRA layer (`workbench::multi_lora`, forward and
  backward in `lora_ops.py`) with `torch._grouped_mm` as its kernel: no Python loop over
  runs, and nothing torch.compile must specialise on the token counts.
- "per_run_loop": the same op with our own loop over each run's rows, reading counts that
  are already on the host. Where torch has no real grouped kernel (float32 on CUDA, any
  GPU before Hopper) its `_grouped_mm` loops too, but copies the offsets to the host
  first: a sync in every LoRA layer, which this loop avoids (`grouped_mm_problem`).
- "plain": the reference: each run's slice of tokens through ordinary matmuls and autograd.
"auto" is decided once per device and dtype at set-up, not in the forward: "grouped" where
torch has the kernel and the layer's shapes meet its alignment rule, else "per_run_loop",
with the reason logged at WARNING level once.

Adapter weights (and so their AdamW state) are float32 whatever the base's dtype, as in
peft: an update near the learning rate would round away in a bf16 weight of about 0.03.
The matmuls run in the activations' dtype (bf16 with a bf16 base, as FSDP's mixed precision
does), the weights cast on the way in; their gradients come back float32.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import LORA_TARGET_MODULES, OrchestratorConfig, lora_rank_problem
from workbench.trainer.lora.ops import grouped_mm_problem, multi_lora
from workbench.trainer.transfer import to_device

if TYPE_CHECKING:
    from workbench.trainer.runs.manager import MultiRunManager

logger = logging.getLogger(__name__)

# What a layer computes with: the one op over all runs with torch's grouped kernel
# ("grouped") or with our per-run loop, or the plain reference. "auto" chooses per device.
LoRACompute = Literal["grouped", "per_run_loop", "plain"]
LoRAPath = Literal["auto", "grouped", "per_run_loop", "plain"]

DEFAULT_TARGET_MODULES = LORA_TARGET_MODULES

_ROUTING_ATTRIBUTE = "_workbench_lora_routing"


# ---------------------------------------------------------------------------- routing


class LoRARouting(threading.local):
    """Which tokens of the current micro-batch belong to which adapter slot.

    One object per model, shared by all its `MultiLoRALinear` layers, so the counts are
    converted (host list, offsets on the host and on the device) once per micro-batch
    rather than once per layer. Its state is per thread: on the CPU several threads each
    compute a row of their own (`workbench.trainer.row_threads`), and each must route its
    own row's tokens, in the forward and in the recomputation during its backward.

    The thread that runs a backward is not always the one that ran its forward: on CUDA
    autograd runs the backward in a device thread of its own, whose routing was never set.
    A recomputation there routes as its forward did through `snapshot` and `routed_as`
    (`compute.apply_activation_checkpointing`).
    """

    def __init__(self, n_adapters: int):
        self.n_adapters = n_adapters
        self.num_tokens: torch.Tensor | None = None
        self.host_counts: list[int] = []
        self.total_tokens = 0
        self.host_offsets = torch.zeros(n_adapters, dtype=torch.int32)
        self.device_offsets = self.host_offsets
        # The slots with tokens in this micro-batch, their offsets and, on the device, their
        # indices: the layers multiply only these slots' adapters (see `_grouped_forward`).
        self.active_slots: list[int] = []
        self.active_host_offsets = self.host_offsets
        self.active_device_offsets = self.host_offsets
        self.active_device_index = torch.zeros(0, dtype=torch.long)
        # True inside `adapters_disabled`: the layers compute the base model alone.
        self.adapters_off = False
        # Routed by datum groups (`route_datum_groups`): each group's slot, and the weight
        # copies each layer made for them in the forward, which take the groups' gradients.
        self.group_slots: list[int] | None = None
        self.group_device_index = torch.zeros(0, dtype=torch.long)
        self.group_leaves: list[tuple[MultiLoRALinear, torch.Tensor, torch.Tensor]] = []

    def set_num_tokens(
        self, lora_num_tokens: torch.Tensor | Sequence[int], device: torch.device | None = None
    ) -> None:
        """Route the next forward; `device` is where the layers compute (default: the CPU).

        Pass host counts: reading counts that live on a GPU would be a host sync."""
        counts = torch.as_tensor(lora_num_tokens, dtype=torch.long)
        if counts.ndim != 1 or counts.numel() != self.n_adapters:
            raise ValueError(
                f"lora_num_tokens must have one count per adapter slot ({self.n_adapters}), "
                f"got shape {tuple(counts.shape)}"
            )
        host_counts = counts.tolist()
        if min(host_counts) < 0:
            raise ValueError(f"lora_num_tokens must be non-negative, got {host_counts}")
        device = device or torch.device("cpu")
        self.num_tokens = counts
        self.host_counts = host_counts
        self.total_tokens = sum(host_counts)
        # Cumulative end of each slot's tokens (int32), as the grouped kernels want them: the
        # per-run loop reads them on the host, torch._grouped_mm on the device (pinned,
        # non-blocking copies, once per micro-batch).
        self.host_offsets = _cumulative(host_counts)
        self.device_offsets = to_device(self.host_offsets, device)
        self.active_slots = [slot for slot, count in enumerate(host_counts) if count]
        if len(self.active_slots) == self.n_adapters:
            self.active_host_offsets, self.active_device_offsets = (
                self.host_offsets,
                self.device_offsets,
            )
        else:
            self.active_host_offsets = _cumulative([c for c in host_counts if c])
            self.active_device_offsets = to_device(self.active_host_offsets, device)
        self.active_device_index = to_device(
            torch.tensor(self.active_slots, dtype=torch.long), device
        )
        self.group_slots, self.group_leaves = None, []

    def set_datum_groups(
        self, counts: Sequence[int], slots: Sequence[int], device: torch.device | None = None
    ) -> None:
        """Route the next forward by groups rather than by slots: group g is the next
        `counts[g]` tokens and computes with the adapter of slot `slots[g]`, through copies
        of that adapter's weights of its own (leaves made in the forward, `group_leaves`).

        A group's gradient then comes back on its own, whatever else the row holds, and the
        caller adds it to the slot's in an order of its choosing: a Tinker datum's adapter
        gradient, the same bits alone and packed (`rl/tinker_packing.py`). Several groups may
        share a slot; each has at least one token.
        """
        if len(counts) != len(slots) or not counts or min(counts) < 1:
            raise ValueError(f"one slot per group of at least one token, got {counts}, {slots}")
        if not all(0 <= slot < self.n_adapters for slot in slots):
            raise ValueError(f"group slots {list(slots)} outside 0..{self.n_adapters - 1}")
        device = device or torch.device("cpu")
        self.num_tokens = torch.as_tensor(list(counts), dtype=torch.long)
        self.host_counts = list(counts)
        self.total_tokens = sum(counts)
        self.host_offsets = _cumulative(list(counts))
        self.device_offsets = to_device(self.host_offsets, device)
        self.active_slots = []
        self.active_host_offsets, self.active_device_offsets = (
            self.host_offsets,
            self.device_offsets,
        )
        self.group_slots = list(slots)
        self.group_device_index = to_device(torch.tensor(slots, dtype=torch.long), device)
        self.group_leaves = []

    def snapshot(self) -> dict:
        """The calling thread's routing, for `routed_as`."""
        return dict(self.__dict__)

    @contextlib.contextmanager
    def routed_as(self, snapshot: dict) -> Iterator[None]:
        """Route the calling thread as `snapshot` inside the block, then as it was before."""
        before = dict(self.__dict__)
        self.__dict__.update(snapshot)
        try:
            yield
        finally:
            self.__dict__.clear()
            self.__dict__.update(before)

    def offsets(self, grouped_mm: bool, device: torch.device, active: bool = False) -> torch.Tensor:
        """The offsets a grouped op takes: on `device` for torch._grouped_mm, else on the host;
        of every slot, or with `active` of the slots with tokens only."""
        if self.num_tokens is None:
            raise RuntimeError("no token counts set; call set_lora_num_tokens(model, counts)")
        host = self.active_host_offsets if active else self.host_offsets
        if not grouped_mm:
            return host
        on_device = self.active_device_offsets if active else self.device_offsets
        if on_device.device == device:
            return on_device
        return host.to(device)  # counts set without the device: a copy per layer


def _cumulative(counts: list[int]) -> torch.Tensor:
    return torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32)


def set_lora_num_tokens(model: nn.Module, lora_num_tokens: torch.Tensor | Sequence[int]) -> None:
    """Route the next forward: the first `lora_num_tokens[0]` tokens to slot 0, and so on.

    Keep the counts set until the backward pass has finished: activation checkpointing
    recomputes the forward during backward and reads them again.
    """
    device = next(model.parameters()).device
    get_lora_routing(model).set_num_tokens(lora_num_tokens, device)


def route_datum_groups(model: nn.Module, counts: Sequence[int], slots: Sequence[int]) -> None:
    """Route the next forward by datum groups (`LoRARouting.set_datum_groups`)."""
    device = next(model.parameters()).device
    get_lora_routing(model).set_datum_groups(counts, slots, device)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Inside the block, the calling thread's forwards skip every adapter: the base model's
    log-probs, for a run's KL term to the base (one forward serves every run of a row)."""
    routing = get_lora_routing(model)
    routing.adapters_off = True
    try:
        yield
    finally:
        routing.adapters_off = False


def find_lora_routing(model: nn.Module) -> LoRARouting | None:
    """The routing of `model`'s multi-LoRA layers; None before `apply_lora_to_model`."""
    return getattr(model, _ROUTING_ATTRIBUTE, None)


def get_lora_routing(model: nn.Module) -> LoRARouting:
    routing = find_lora_routing(model)
    if routing is None:
        raise RuntimeError("this model has no multi-LoRA layers; call apply_lora_to_model first")
    return routing


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
        # Resolved once per (device, dtype) of the activations, by `select_compute`.
        self.compute: LoRACompute = "plain"
        self.compute_reason = ""
        self._compute_for: tuple[torch.device, torch.dtype] | None = None

        factory = {"device": base_layer.weight.device, "dtype": dtype or adapter_dtype(base_layer)}
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
            f"rank={self.rank}, n_adapters={self.n_adapters}, alpha={self.alpha}, "
            f"path={self.path}, compute={self.compute}"
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

    def adapter_scaling(self, idx: int) -> float:
        return self._adapter_alpha[idx] / self._adapter_rank[idx]

    # ------------------------------------------------------------------ the LoRAModule protocol

    def named_parameters_for_adapter(self, idx: int) -> Iterator[tuple[str, nn.Parameter]]:
        self._check_idx(idx)
        yield "lora_A", self.lora_A[idx]
        yield "lora_B", self.lora_B[idx]

    def state_dict_for_adapter(self, idx: int, *, copy: bool = True) -> dict[str, torch.Tensor]:
        """peft-named tensors of slot `idx`, cut to the run's rank: A [r, in], B [out, r];
        with `copy=False` views of the slot's own tensors, which the next update changes."""
        self._check_idx(idx)
        rank = self._adapter_rank[idx]
        a, b = self.lora_A[idx][:rank].detach(), self.lora_B[idx][:, :rank].detach()
        if copy:
            a, b = a.clone().contiguous(), b.clone().contiguous()
        return {"lora_A.weight": a, "lora_B.weight": b}

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
        # Checked in eager mode only: a compiled graph comparing its row length with the
        # counts would be specialised to that length.
        if not torch.compiler.is_compiling() and routing.total_tokens != flat.shape[0]:
            raise ValueError(
                f"{self.name or 'MultiLoRALinear'}: lora_num_tokens sums to "
                f"{routing.total_tokens} but the input has {flat.shape[0]} tokens"
            )
        if flat.shape[0] == 0 or routing.adapters_off:
            return result
        if self._compute_for != (flat.device, flat.dtype):
            # Normally done once at set-up (`apply_lora_to_model`); again only if the model
            # moved to another device or dtype since.
            self.select_compute(flat.device, flat.dtype)
        if routing.group_slots is not None:
            delta = self._datum_group_forward(flat, grouped_mm=self.compute == "grouped")
        elif self.compute == "plain":
            delta = self._plain_forward(flat)
        else:
            delta = self._grouped_forward(flat, grouped_mm=self.compute == "grouped")
        return result + delta.view(result.shape).to(result.dtype)

    def select_compute(self, device: torch.device, dtype: torch.dtype) -> LoRACompute:
        """Decide, once for activations of `device` and `dtype`, how this layer computes.

        A path other than "auto" is taken as it is ("grouped" runs torch._grouped_mm
        wherever it runs at all, host syncs and all); "auto" takes "grouped" where
        it has a real kernel and this layer's shapes meet its alignment rule, else the
        per-run loop, and says why at WARNING level (once per reason).
        """
        reason = ""
        if self.path != "auto":
            compute: LoRACompute = self.path
        else:
            reason = grouped_mm_problem(device.type, dtype) or self._alignment_problem(dtype)
            compute = "per_run_loop" if reason else "grouped"
            if reason:
                _warn_once(f"LoRA layers use the per-run loop, not torch._grouped_mm: {reason}")
        self.compute, self.compute_reason = compute, reason
        self._compute_for = (torch.device(device), dtype)
        return compute

    def _alignment_problem(self, dtype: torch.dtype) -> str:
        # grouped_mm wants 16-byte aligned rows for every operand, transposed ones included.
        itemsize = torch.empty(0, dtype=dtype).element_size()
        sizes = {"in": self.in_features, "out": self.out_features, "rank": self.rank}
        unaligned = {name: size for name, size in sizes.items() if (size * itemsize) % 16}
        if not unaligned:
            return ""
        return (
            f"features or rank {unaligned} are not a multiple of 16 bytes of "
            f"{str(dtype).removeprefix('torch.')}, as torch._grouped_mm needs"
        )

    def _grouped_forward(self, flat: torch.Tensor, grouped_mm: bool) -> torch.Tensor:
        routing = self.routing
        slots = routing.active_slots
        # Only the slots with tokens in this micro-batch: most rows hold one run's tokens,
        # and stacking, scaling and differentiating every slot's adapter in every layer
        # was 3-4 % of a 4-run update's CPU time. Each slot's rows get the same products,
        # bit for bit, either way. A compiled graph takes every slot, or it would be
        # specialised to which slots have tokens.
        if torch.compiler.is_compiling() or len(slots) == self.n_adapters:
            lora_a, lora_b, rank_scaling = self.lora_A, self.lora_B, self.rank_scaling
            offsets = routing.offsets(grouped_mm, flat.device)
        else:
            lora_a = [self.lora_A[slot] for slot in slots]
            lora_b = [self.lora_B[slot] for slot in slots]
            index = routing.active_device_index
            if index.device != self.rank_scaling.device:
                index = index.to(self.rank_scaling.device)
            rank_scaling = self.rank_scaling.index_select(0, index)
            offsets = routing.offsets(grouped_mm, flat.device, active=True)
        # The weights are float32; the product runs in the activations' dtype.
        stacked_a = torch.stack(tuple(lora_a)).to(flat.dtype)
        scaled_lora_b = torch.stack(tuple(lora_b)) * rank_scaling[:, None]
        return multi_lora(
            flat.contiguous(), stacked_a, scaled_lora_b.to(flat.dtype), offsets, grouped_mm
        )

    def _datum_group_forward(self, flat: torch.Tensor, grouped_mm: bool) -> torch.Tensor:
        """Each group through copies of its slot's weights, leaves of their own: stacked,
        scaled and multiplied as `_grouped_forward` does one slot's."""
        routing = self.routing
        slots = routing.group_slots
        leaf_a = torch.stack([self.lora_A[slot].detach() for slot in slots]).requires_grad_()
        leaf_b = torch.stack([self.lora_B[slot].detach() for slot in slots]).requires_grad_()
        routing.group_leaves.append((self, leaf_a, leaf_b))
        index = routing.group_device_index
        if index.device != self.rank_scaling.device:
            index = index.to(self.rank_scaling.device)
        scaled_lora_b = leaf_b * self.rank_scaling.index_select(0, index)[:, None]
        return multi_lora(
            flat.contiguous(),
            leaf_a.to(flat.dtype),
            scaled_lora_b.to(flat.dtype),
            routing.offsets(grouped_mm, flat.device),
            grouped_mm,
        )

    def _plain_forward(self, flat: torch.Tensor) -> torch.Tensor:
        parts = []
        for idx, part in enumerate(flat.split(self.routing.host_counts)):
            if part.shape[0] == 0:
                continue
            rank = self._adapter_rank[idx]
            lora_a = self.lora_A[idx][:rank].to(part.dtype)
            lora_b = self.lora_B[idx][:, :rank].to(part.dtype)
            parts.append(F.linear(F.linear(part, lora_a), lora_b) * self.adapter_scaling(idx))
        return torch.cat(parts)

    def _check_idx(self, idx: int) -> None:
        if not 0 <= idx < self.n_adapters:
            raise IndexError(f"adapter index {idx} is outside 0..{self.n_adapters - 1}")


def adapter_dtype(base_layer: nn.Linear) -> torch.dtype:
    """float32 for a half-precision base (bf16, fp16), as peft keeps adapters; else the base's."""
    return torch.promote_types(base_layer.weight.dtype, torch.float32)


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)


def lora_compute_summary(model: nn.Module) -> str:
    """What the model's LoRA layers compute with, for logs and benchmark rows: "grouped
    matmul", "per-run loop (why)", "plain", or a mix with layer counts."""
    layers = [m for m in model.modules() if isinstance(m, MultiLoRALinear)]
    kinds = Counter(
        COMPUTE_NAMES[m.compute] + (f" ({m.compute_reason})" if m.compute_reason else "")
        for m in layers
    )
    if len(kinds) == 1:
        return next(iter(kinds))
    return ", ".join(f"{kind}: {count} layers" for kind, count in kinds.most_common())


COMPUTE_NAMES: dict[str, str] = {
    "grouped": "grouped matmul",
    "per_run_loop": "per-run loop",
    "plain": "plain",
}


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
    routing = LoRARouting(manager.max_runs)
    model.requires_grad_(False)
    layers = _wrap_target_linears(
        model,
        set(target_modules),
        lambda name, linear: MultiLoRALinear(
            linear, rank, manager.max_runs, alpha, path=path, routing=routing, name=name
        ),
    )
    for module_name, layer in layers.items():
        manager.register_lora_module(module_name, layer)
        # Decided here, not in the forward: torch.compile then sees a plain attribute.
        layer.select_compute(layer.weight.device, layer.weight.dtype)
    setattr(model, _ROUTING_ATTRIBUTE, routing)
    logger.info("LoRA compute: %s", lora_compute_summary(model))
    _register_run_hooks(manager, layers, rank, alpha)
    return list(layers)


def _wrap_target_linears(
    model: nn.Module,
    targets: set[str],
    wrap: Callable[[str, nn.Linear], MultiLoRALinear],
) -> dict[str, MultiLoRALinear]:
    """Replace each linear whose name ends in one of `targets` by `wrap(path, linear)`;
    the wrapped layers by module path. No match is an error naming the linears there are."""
    layers: dict[str, MultiLoRALinear] = {}
    for module_name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or module_name.rsplit(".", 1)[-1] not in targets:
            continue
        parent_name, _, child_name = module_name.rpartition(".")
        layer = wrap(module_name, module)
        setattr(model.get_submodule(parent_name), child_name, layer)
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
    return layers


def _register_run_hooks(
    manager: MultiRunManager, layers: dict[str, MultiLoRALinear], rank: int, alpha: float
) -> None:
    """The manager's hooks for the layers: refuse a run whose rank exceeds the trainer's;
    give each new run its rank, alpha and seeded initial adapter; clear a deleted run's."""

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
