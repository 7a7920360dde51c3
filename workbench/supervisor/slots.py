"""How many runs fit at once: what one trainer slot and one vLLM adapter cost, against the
memory of the devices that hold them (`[trainer] max_concurrent_runs = "auto"`).

One trainer slot holds a run's adapter, its gradients and its AdamW moments, all float32
(16 bytes a parameter), on every trainer rank's device, and its orchestrator (a process on
the host). One vLLM adapter (`[inference] max_loras` of them, by default two a slot) holds
a place in vLLM's stacked LoRA buffers, which vLLM allocates for every linear layer it can
adapt at `max_lora_rank` whatever the adapter targets, on vLLM's device, and a copy of the
adapter in vLLM's CPU cache on the host. The adapter sizes come from the base model's
config (`workbench.models.resolve.model_shapes`: nothing is loaded).

Each memory (the host, the trainer's GPU, vLLM's GPU, one GPU both share) is a `Pool`: what
an experiment may plan for, what it holds whatever the number of runs (weights, vLLM's KV
cache, runtimes) and what each slot and adapter add. Totals, not what is free now, so the
answer is the same from one `up` to the next; the share planned for leaves room for the
system, and on a GPU for activations and vLLM's KV cache.

`size_slots(recipe)` gives the `SlotSizing`: how many slots fit, the lines `up --dry-run`
prints, and the problem of an explicit `max_concurrent_runs` or `max_loras` that does not
fit. `resolve_auto_slots` writes the number into a recipe that asks for "auto".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import tomlkit

from workbench.config import ConfigProblem, default_max_loras, problem_at
from workbench.inference.server import (
    CPU_KV_CACHE_ENV,
    CPU_RUNTIME_GIB,
    DEFAULT_CPU_KV_CACHE_GIB,
    GIB,
)
from workbench.models.resolve import ModelShapes, model_shapes
from workbench.recipe import Recipe
from workbench.supervisor.devices import DeviceAssignment, assign_devices
from workbench.system.gpus import detect_gpu_count, gpu_memory_bytes
from workbench.system.procfs import memory_total_bytes

# AdamW on float32 adapters: the weight, its gradient and two moments, 4 bytes each.
TRAINER_BYTES_PER_PARAMETER = 16
# An orchestrator's resident memory: about 64 MB measured on this project's 2-core machine
# (issue 44); `bench e2e --vs separate` saw one experiment of 4 runs peak 207 MB above one
# of 1 run (3,602 against 3,395 MB, e2e-separate-latest.json), some 69 MB a run.
ORCHESTRATOR_BYTES = 64 << 20
# The trainer process's runtime beside its weights (torch, the model's code, gloo): one
# experiment of one run on the built-in model peaked at 3,395 MB all told, of which vLLM's
# share is its KV cache, runtime and weights (2.5 GiB); rounded up.
TRAINER_RUNTIME_BYTES = 1 * GIB
# The host memory an experiment plans for: the rest is the system's, the page cache's and
# the supervisor's and TUI's.
HOST_SHARE = 0.75
# Of what a GPU leaves once the weights are on it, the share adapters may take: the rest
# goes to the trainer's activations, or to vLLM's KV cache.
GPU_ADAPTER_SHARE = 0.5
# "auto" where the memory cannot be counted: the default of `max_concurrent_runs`.
SLOTS_WHEN_UNKNOWN = 4
# vLLM's own layer names: its LoRA buffers cover every linear layer of the decoder (q, k, v
# packed, gate and up packed), not the LM head.
UNADAPTED_BY_VLLM = ("lm_head",)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a recipe's dtype name (vLLM's and the trainer's spellings)."""
    return 4 if dtype in ("float32", "float") else 2


@dataclass
class Pool:
    """One memory, and what the experiment puts in it: `fixed` whatever the number of runs,
    `per_slot` for each trainer slot and `per_adapter` for each of vLLM's adapters."""

    name: str
    total: int
    share: float
    fixed: list[tuple[str, int]] = field(default_factory=list)
    per_slot: list[tuple[str, int]] = field(default_factory=list)
    per_adapter: list[tuple[str, int]] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return int(self.total * self.share)

    def needs(self, slots: int, adapters: int) -> int:
        return (
            sum(size for _, size in self.fixed)
            + slots * sum(size for _, size in self.per_slot)
            + adapters * sum(size for _, size in self.per_adapter)
        )

    @property
    def fixed_fits(self) -> bool:
        """Whether what the experiment holds here whatever its runs fits at all: where not,
        the model is too large for this memory, which no number of slots mends (vLLM's
        and the trainer's own checks say so as they start)."""
        return sum(size for _, size in self.fixed) <= self.usable

    def slots_that_fit(self, max_loras: int | None) -> int:
        """The most slots this memory holds, each with `default_max_loras`' adapters, or with
        `max_loras` adapters in all when that is set."""
        room = self.usable - sum(size for _, size in self.fixed)
        per_adapter = sum(size for _, size in self.per_adapter)
        per_slot = sum(size for _, size in self.per_slot)
        if max_loras is not None:
            room -= max_loras * per_adapter
        else:
            per_slot += default_max_loras(1) * per_adapter
        if room < 0:
            return 0
        return room // per_slot if per_slot else 1 << 20

    def describe(self) -> list[str]:
        """The arithmetic, a few lines."""
        lines = [
            f"{self.name}: {gib(self.usable)} planned for ({self.share:.0%} of {gib(self.total)})"
        ]
        for label, parts in (
            ("fixed", self.fixed),
            ("per trainer slot", self.per_slot),
            ("per vLLM adapter", self.per_adapter),
        ):
            if parts:
                items = ", ".join(f"{what} {size_text(size)}" for what, size in parts)
                total = size_text(sum(size for _, size in parts))
                lines.append(f"  {label} {total}: {items}")
        return lines


def gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


def size_text(size: int) -> str:
    """Bytes in the unit that reads best: KiB, MiB or GiB."""
    if size >= GIB:
        return gib(size)
    if size >= 1 << 20:
        return f"{size / (1 << 20):.1f} MiB"
    return f"{size / 1024:.1f} KiB"


@dataclass
class SlotSizing:
    """How many slots fit, and why: `fit` (None: unknown, the model's shapes or a device's
    memory could not be read), the pools, and a note when something was not counted."""

    fit: int | None
    pools: list[Pool]
    notes: list[str] = field(default_factory=list)
    auto: bool = False  # the recipe asked for "auto" (`resolve_auto_slots`)

    def lines(self, slots: int, max_loras: int) -> list[str]:
        """What `up --dry-run` prints about the slots."""
        how = ' ("auto")' if self.auto else ""
        fit = "unknown" if self.fit is None else str(self.fit)
        lines = [
            f"slots: max_concurrent_runs = {slots}{how}, max_loras = {max_loras}; "
            f"memory holds {fit}"
        ]
        for pool in self.pools:
            need = pool.needs(slots, max_loras)
            lines += pool.describe()
            lines.append(
                f"  with {slots} slots and {max_loras} adapters: {size_text(need)} of "
                f"{gib(pool.usable)}"
            )
        return lines + self.notes

    def problem(self, recipe: Recipe, text: str | None) -> ConfigProblem | None:
        """Why the recipe's slots and adapters do not fit, naming the key to lower."""
        slots, adapters = recipe.trainer.max_concurrent_runs, recipe.max_loras
        assert isinstance(slots, int), "resolve_auto_slots first"
        for pool in self.pools:
            need = pool.needs(slots, adapters)
            if need <= pool.usable or not pool.fixed_fits:
                continue
            default_adapters = default_max_loras(slots)
            blame_loras = (
                recipe.inference.max_loras is not None
                and pool.needs(slots, default_adapters) <= pool.usable
            )
            key = ("inference", "max_loras") if blame_loras else ("trainer", "max_concurrent_runs")
            asked = (
                f"[inference] max_loras = {adapters}"
                if blame_loras
                else f'[trainer] max_concurrent_runs = "auto" (not even {slots} slot)'
                if self.auto
                else f"[trainer] max_concurrent_runs = {slots}"
            )
            fits = pool.slots_that_fit(recipe.inference.max_loras)
            message = (
                f"{asked} does not fit {pool.name}: {slots} trainer slots x "
                f"{size_text(sum(s for _, s in pool.per_slot))} + {adapters} vLLM adapters x "
                f"{size_text(sum(s for _, s in pool.per_adapter))} + "
                f"{size_text(sum(s for _, s in pool.fixed))} fixed = {gib(need)}, above the "
                f"{gib(pool.usable)} planned for ({pool.share:.0%} of {gib(pool.total)}); "
                + (
                    f"lower max_loras to at most {default_adapters}, or leave it out"
                    if blame_loras
                    else "free memory or lower [trainer] lora.rank"
                    if self.auto
                    else f'at most {fits} slots fit: lower it, or set it to "auto"'
                )
                + " (`workbench up --dry-run` shows the arithmetic)"
            )
            return problem_at(key, message, text)
        return None


def size_slots(recipe: Recipe) -> SlotSizing:
    """What one slot and one adapter cost on each of this machine's memories, and how many
    fit; an unknown model (a hub id not cached) or GPU memory leaves `fit` None."""
    try:
        shapes = model_shapes(recipe.model.base)
    except Exception as err:  # the target_modules check reports a model that cannot be made
        return SlotSizing(None, [], [f"slots: the base model's layers cannot be read ({err})"])
    if shapes is None:
        return SlotSizing(
            None,
            [],
            ["slots: the base model is not cached, so its adapters' size is unknown; "
             "nothing was counted"],
        )  # fmt: skip
    host_total = memory_total_bytes() or 0
    gpu_count = detect_gpu_count()
    gpus = gpu_memory_bytes() if gpu_count else []
    if gpu_count and not gpus:
        return SlotSizing(
            None, [], ["slots: the GPUs' memory cannot be read (nvidia-smi); nothing was counted"]
        )
    pools = machine_pools(recipe, shapes, host_total, gpus or [])
    counted = [pool for pool in pools if pool.fixed_fits]
    notes = [
        f"slots: {pool.name}: the weights and runtimes alone take "
        f"{gib(sum(size for _, size in pool.fixed))} of the {gib(pool.usable)} planned for; "
        "the model may not fit here, and the slots were not counted against it"
        for pool in pools
        if not pool.fixed_fits
    ]
    fit = min((pool.slots_that_fit(recipe.inference.max_loras) for pool in counted), default=None)
    return SlotSizing(fit, pools, notes)


def machine_pools(
    recipe: Recipe, shapes: ModelShapes, host_total: int, gpus: list[int]
) -> list[Pool]:
    """The memories of a machine with `host_total` bytes and GPUs of `gpus` bytes each (none:
    everything on the CPU), and what the recipe puts in each."""
    costs = _Costs.of(recipe, shapes)
    host = Pool("the host", host_total, HOST_SHARE, per_slot=[costs.orchestrator])
    host.per_adapter.append(costs.vllm_cached)
    if not gpus:
        kv_cache = float(os.environ.get(CPU_KV_CACHE_ENV) or DEFAULT_CPU_KV_CACHE_GIB)
        host.fixed += [
            ("trainer weights", costs.trainer_weights),
            ("trainer runtime", TRAINER_RUNTIME_BYTES),
            ("vLLM weights", costs.vllm_weights),
            (f"vLLM KV cache ({CPU_KV_CACHE_ENV})", int(kv_cache * GIB)),
            ("vLLM runtime", int(CPU_RUNTIME_GIB * GIB)),
        ]
        host.per_slot.insert(0, costs.trainer_slot)
        host.per_adapter.insert(0, costs.vllm_slot)
        return [host]
    host.fixed += [
        ("trainer runtime", TRAINER_RUNTIME_BYTES * recipe.trainer.nproc_per_node),
        ("vLLM runtime", int(CPU_RUNTIME_GIB * GIB)),
    ]
    return [*_gpu_pools(recipe, costs, gpus), host]


@dataclass
class _Costs:
    """What the recipe's model and settings cost: per slot, per adapter, and the weights."""

    trainer_slot: tuple[str, int]
    vllm_slot: tuple[str, int]
    vllm_cached: tuple[str, int]
    orchestrator: tuple[str, int]
    trainer_weights: int
    vllm_weights: int

    @classmethod
    def of(cls, recipe: Recipe, shapes: ModelShapes) -> _Costs:
        trainer, inference = recipe.trainer, recipe.inference
        # vLLM's "auto" dtype is the trainer's (`Recipe.inference_config`).
        served = inference.dtype if inference.dtype != "auto" else trainer.dtype
        served_bytes = dtype_bytes(served)
        slot_adapter = shapes.adapter_parameters(trainer.lora.rank, trainer.target_modules)
        vllm_layers = [name for name in shapes.linears if name not in UNADAPTED_BY_VLLM]
        vllm_buffer = shapes.adapter_parameters(recipe.max_lora_rank or 512, vllm_layers)
        ranks = trainer.nproc_per_node * trainer.nnodes
        trainer_weights = shapes.parameters * dtype_bytes(trainer.dtype)
        if trainer.shards_base(ranks):
            trainer_weights //= ranks
        return cls(
            trainer_slot=(
                "adapter, gradients and AdamW state",
                slot_adapter * TRAINER_BYTES_PER_PARAMETER,
            ),
            vllm_slot=("vLLM's LoRA buffers", vllm_buffer * served_bytes),
            vllm_cached=("vLLM's CPU copy", slot_adapter * served_bytes),
            orchestrator=("orchestrator", ORCHESTRATOR_BYTES),
            trainer_weights=trainer_weights,
            vllm_weights=shapes.parameters * served_bytes // inference.tensor_parallel_size,
        )


def _gpu_pools(recipe: Recipe, costs: _Costs, gpus: list[int]) -> list[Pool]:
    """The trainer's GPU and vLLM's (the same one, each with its share, when they share)."""
    inference = recipe.inference
    size = inference.tensor_parallel_size * inference.data_parallel_size
    devices = assign_devices_for(recipe, len(gpus), size)
    vllm_gpu = devices.inference[0]
    trainer_gpu = devices.trainer[0]
    vllm_pool = Pool(
        f"vLLM's GPU {vllm_gpu}",
        int(gpus[vllm_gpu] * inference.gpu_memory_utilization),
        GPU_ADAPTER_SHARE,
        fixed=[("vLLM weights", costs.vllm_weights)],
        per_adapter=[costs.vllm_slot],
    )
    trainer_memory = gpus[trainer_gpu]
    if trainer_gpu in devices.inference:
        trainer_memory = int(trainer_memory * (1 - inference.gpu_memory_utilization))
    trainer_pool = Pool(
        f"the trainer's GPU {trainer_gpu}",
        trainer_memory,
        GPU_ADAPTER_SHARE,
        fixed=[("trainer weights", costs.trainer_weights)],
        per_slot=[costs.trainer_slot],
    )
    return [trainer_pool, vllm_pool]


def assign_devices_for(recipe: Recipe, gpu_count: int, inference_size: int) -> DeviceAssignment:
    return assign_devices(
        recipe.inference.gpus,
        recipe.trainer.gpus,
        recipe.trainer.nproc_per_node,
        gpu_count,
        inference_size,
    )


def resolve_auto_slots(
    recipe: Recipe, document: tomlkit.TOMLDocument | None = None
) -> SlotSizing | None:
    """Set `max_concurrent_runs = "auto"` to a number: as many slots as the recipe has runs,
    at most as many as fit (at least one; `SlotSizing.problem` says when not even one fits).
    The document, written as the experiment's recipe.toml, gets the number and a comment.
    None, and nothing changed, for a recipe that names a number."""
    if recipe.trainer.max_concurrent_runs != "auto":
        return None
    sizing = size_slots(recipe)
    sizing.auto = True
    runs = max(1, len(recipe.runs))
    if sizing.fit is None:
        slots = min(runs, SLOTS_WHEN_UNKNOWN)
        why = f"one per run up to {SLOTS_WHEN_UNKNOWN}, memory unknown"
    else:
        slots = max(1, min(runs, sizing.fit))
        why = f"one per run ({runs})" if runs <= sizing.fit else f"all that fit, for {runs} runs"
    recipe.trainer.max_concurrent_runs = slots
    sizing.notes.append(f'slots: "auto" gives {slots}, {why}')
    if document is not None:
        section = document.setdefault("trainer", tomlkit.table())
        section["max_concurrent_runs"] = slots
        section["max_concurrent_runs"].comment(f'"auto" at launch: {why}')
    return sizing
