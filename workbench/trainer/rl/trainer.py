"""`torchrun ... -m workbench.trainer.rl.trainer --config PATH`: the one trainer every run shares.

Read top to bottom: `main` loads the frozen base model (`load_base_model`) and hands it to
`build_trainer`, which wraps its linears in multi-adapter LoRA layers and wires the per-run
optimizer, scheduler and checkpoints to the multi-run manager's hooks; `train_forever` is
the loop; `iterate` is one pass of it; `train_step` is one update of every run with data.
How the ranks split the work and sum their gradients is `workbench.trainer.parallel.distributed`;
how they hold the frozen base (whole, or sharded by FSDP2) is `workbench.trainer.compute.sharding`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from workbench.config import ConfigError, LossConfig, TrainerConfig, load_trainer_config
from workbench.files import busy, layout
from workbench.files.metrics import append_metrics
from workbench.system.lifeline import die_with_parent
from workbench.system.priority import run_as_batch
from workbench.trainer.compute.model import HostRow, RowLogprobs, prepare_model
from workbench.trainer.compute.sharding import shard_base
from workbench.trainer.lora.layer import (
    adapters_disabled,
    apply_lora_to_model,
    resolve_run_lora,
    set_lora_num_tokens,
)
from workbench.trainer.losses.admission import validate_run_loss
from workbench.trainer.optim.per_run import MultiLoRAOptimizer, MultiLoRAScheduler
from workbench.trainer.parallel import distributed
from workbench.trainer.rl.loss import RLLossOutput, compute_rl_loss
from workbench.trainer.rl.packer import MicroBatch, Packer, filler_row
from workbench.trainer.rl.state import Trainer, adapter_copy
from workbench.trainer.rl.step_stats import StepStats, StepTally
from workbench.trainer.rl.tinker_packing import (
    TinkerPack,
    TinkerPackOutput,
    accumulate_in_datum_order,
    pack_output,
    pass_rows,
)
from workbench.trainer.rl.tinker_work import (
    TinkerPass,
    TinkerRow,
    TinkerRowOutput,
    collect_tinker_work,
    finish_tinker_pass,
    forget_tinker_slot,
    row_parameters,
    start_tinker_pass,
    tinker_row_output,
    tinker_slots,
    wait_for_tinker_work,
)
from workbench.trainer.row_threads import (
    RowThreads,
    accumulate_in_order,
    resolve_row_threads,
    torch_threads,
)
from workbench.trainer.runs.checkpoint import RunCheckpointer, remove_killed_writes
from workbench.trainer.runs.divergence import NonFiniteWeights, adapter_divergence
from workbench.trainer.runs.init_adapter import check_init_adapter, load_adapter_into_slot
from workbench.trainer.runs.manager import MultiRunManager
from workbench.trainer.runs.publisher import FailedWrite
from workbench.trainer.transfer import to_device

logger = logging.getLogger("workbench.trainer")


# ---------------------------------------------------------------------- setup


def load_base_model(
    base: str, dtype: torch.dtype, device: torch.device, experiment: Path | None = None
) -> nn.Module:
    """The frozen base model; a built-in one is built first if no process has built it
    yet, its steps told through `experiment`'s model_build.json (by the master rank)."""
    from transformers import AutoModelForCausalLM

    from workbench.models.build_progress import BuildProgressFile
    from workbench.models.resolve import resolve_model

    if experiment is None or not distributed.is_master():
        path = resolve_model(base, show_progress=distributed.is_master())
    else:
        with BuildProgressFile(experiment, base) as on_step:
            path = resolve_model(base, on_step=on_step)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    return model.to(device).eval()  # eval: no dropout; the adapters still get gradients


def build_trainer(config: TrainerConfig, model: nn.Module, device: torch.device) -> Trainer:
    section = config.trainer
    manager = MultiRunManager(config.output_dir, section.max_concurrent_runs)
    apply_lora_to_model(
        model, manager, section.lora.rank, section.lora.alpha, section.target_modules
    )
    row_model = RowLogprobs(model, prepare_model(model, section, device))
    sharded = section.shards_base(distributed.world_size())
    if sharded:
        shard_base(row_model, model, device, distributed.world_size())
    threads, not_threaded = resolve_row_threads(
        section.row_threads, device, compiled=section.compile, base_sharded=sharded
    )
    if not_threaded:
        logger.warning(
            "row_threads = %s: one row at a time (%s)", section.row_threads, not_threaded
        )
    share_prompts = section.shares_prompts(row_model.plan.attention)
    logger.info("completions of a prompt %s", "share it" if share_prompts else "repeat it")
    optimizer = MultiLoRAOptimizer(manager)
    scheduler = MultiLoRAScheduler(optimizer)
    checkpointer = RunCheckpointer(manager, optimizer, scheduler)
    trainer = Trainer(
        config=config,
        model=model,
        manager=manager,
        optimizer=optimizer,
        scheduler=scheduler,
        checkpointer=checkpointer,
        packer=Packer(
            manager,
            section.seq_len,
            vocab_size=model.config.vocab_size,
            share_prompts=share_prompts,
        ),
        device=device,
        base_model=config.model.base,
        row_model=row_model,
        base_sharded=sharded,
        row_threads=RowThreads(threads) if threads > 1 else None,
    )

    _register_run_hooks(trainer)
    return trainer


def _register_run_hooks(trainer: Trainer) -> None:
    """The manager's hooks that bring a run in and out of the trainer: its loss tried
    before it gets a slot, its checkpoint (or starting adapter) restored when it comes, its
    progress checkpointed when it leaves, its divergence record dropped."""
    manager, checkpointer = trainer.manager, trainer.checkpointer

    def resume_run(idx: int, run_id: str) -> None:
        # Runs after the optimizer and scheduler hooks (registered earlier), on every rank.
        step = checkpointer.restore(idx)
        if step is None:
            start_from_adapter(trainer, idx)
            return
        logger.info("run %s resumes at step %d", run_id, step)
        run = manager.get_run_dir(idx)
        if manager.is_master and not layout.is_stable(layout.broadcast_dir(run, step)):
            # Stopped between an update and its broadcast (a SIGTERM checkpoints every run
            # at once): the orchestrator waits for this version, so it is published now.
            publish_adapter(trainer, idx)
            logger.info("run %s: adapter of step %d published from its checkpoint", run_id, step)

    def checkpoint_leaving_run(idx: int, run_id: str) -> None:
        # Master only, before the run's data is dropped: an evicted or finished run keeps
        # its latest progress for `workbench restart` (a non-finite adapter is not kept:
        # `save` refuses it, and its latest finite checkpoint stays the one to resume),
        # and its last adapter is written before the slot is another run's.
        log_unwritten(trainer.publisher.reap(wait_for=[idx]))
        trainer.publisher.forget(idx)
        checkpointer.save_if_due(idx, force=True)
        checkpointer.forget(idx)

    # A user's loss is tried once before its run gets a slot: one that fails rejects its
    # run instead of stopping the trainer every run shares.
    manager.register_config_validation_hook(validate_run_loss)
    manager.register_creation_hook(resume_run)
    manager.register_forgotten_hook(checkpoint_leaving_run)
    manager.register_deletion_hook(trainer.divergence.forget)
    # A Tinker run's gradients outlive a pass; they must not outlive its slot.
    manager.register_deletion_hook(lambda idx, run_id: forget_tinker_slot(trainer, idx))


def start_from_adapter(trainer: Trainer, idx: int) -> None:
    """A new run with `lora.init_from`: its slot takes that adapter (every rank), which is
    published as `broadcast/step_0`, the version its orchestrator samples step 0 with."""
    manager, section = trainer.manager, trainer.config.trainer
    init_from = manager.config[idx].lora.init_from
    if init_from is None:
        return
    rank, alpha = resolve_run_lora(manager.config[idx], section.lora.rank, section.lora.alpha)
    check_init_adapter(Path(init_from), trainer.base_model, section.target_modules, rank)
    load_adapter_into_slot(manager, idx, Path(init_from), rank, alpha)
    if manager.is_master:
        publish_adapter(trainer, idx)


# ---------------------------------------------------------------------- one update


def train_step(
    trainer: Trainer,
    rows: list[MicroBatch | TinkerRow | TinkerPack],
    rows_per_rank: int = 0,
    tinker_outputs: list[TinkerRowOutput] | None = None,
) -> StepStats:
    """Forward/backward this rank's rows, sum adapter gradients over ranks, step ready runs.

    Rows of Tinker datums (`tinker_work.TinkerRow`) go into `tinker_outputs`; their runs
    are not stepped here and keep their gradients (an optim_step work item steps them).

    With the base sharded every rank runs `rows_per_rank` rows (the most any rank has),
    making up its own count with rows that train nothing (`filler_row`): each layer is
    gathered from all ranks, so all must run it as often.

    Host syncs on CUDA: none in the LoRA layers, whose token counts are read on the host
    (`set_lora_num_tokens`); the row's tensors go to the GPU pinned and non-blocking (a
    blocking copy would wait for the previous row's backward), as do the sample-boundary
    tensors of `PackedSequences` (attention.py). Per row there remains its one read of the
    position ids (already on the host when they come from the packer), and per update the
    loss and gradient-norm reads (`StepTally`).
    """
    manager, device = trainer.manager, trainer.device
    ready = manager.ready_to_update_idxs
    settings = _RunLossSettings.of(manager)
    tally = StepTally(manager.max_runs, device)
    _backward_rows(trainer, settings, rows, tally, tinker_outputs)
    if trainer.base_sharded:
        for _ in range(rows_per_rank - len(rows)):
            run_filler_row(trainer)

    distributed.all_reduce_grads(
        [param for idx in ready for _, param in manager.get_named_parameters_for_run(idx)], device
    )
    tally.reduce_over_ranks(device)
    norms = trainer.optimizer.step() if ready else {}
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(keep=tinker_slots(manager))
    lrs = {idx: trainer.optimizer.get_lr(idx) for idx in ready}
    return tally.step_stats(ready, norms, lrs, settings.loss_configs)


@dataclass
class _RunLossSettings:
    """Per slot, what its loss needs from its run's config (None / 1 for a free slot)."""

    loss_configs: list[LossConfig | None]
    # vLLM reports log-probs after temperature scaling; the trainer's are scaled the same
    # way, per run (runs may sample at different temperatures).
    temperatures: torch.Tensor
    # Dr. GRPO's constant for `aggregation = "constant"` without `loss.normaliser`: the
    # run's batch_size * max_tokens, as TRL's dr_grpo divides by.
    constants: list[int | None]
    wants_base: torch.Tensor  # runs with a KL term to the base model

    @classmethod
    def of(cls, manager: MultiRunManager) -> _RunLossSettings:
        slots = range(manager.max_runs)
        configs = [manager.config.get(idx) for idx in slots]
        loss_configs = [config.loss if config else None for config in configs]
        temperatures = torch.ones(manager.max_runs)
        for idx in manager.used_idxs:
            temperatures[idx] = manager.config[idx].sampling.temperature  # > 0 (config)
        return cls(
            loss_configs=loss_configs,
            temperatures=temperatures,
            constants=[
                config.batch_size * config.sampling.max_tokens if config else None
                for config in configs
            ],
            wants_base=torch.tensor([c is not None and c.base_kl_coef > 0 for c in loss_configs]),
        )


def _row_loss(trainer: Trainer, settings: _RunLossSettings, row: MicroBatch) -> RLLossOutput:
    """One packed row's forward (and the base model's, for runs with a KL term to it) and
    its loss."""
    model, device = trainer.model, trainer.device
    set_lora_num_tokens(model, row.lora_num_tokens)
    input_ids = to_device(row.input_ids, device)
    token_temperatures = torch.repeat_interleave(settings.temperatures, row.lora_num_tokens)
    host = HostRow(row.position_ids, token_temperatures, needed=row.loss_mask.bool())
    base_logprobs = None
    if bool(settings.wants_base[row.lora_num_tokens > 0].any()):
        # One forward without gradient, adapters off, for the whole row.
        with torch.no_grad(), adapters_disabled(model):
            base_logprobs = trainer.row_model(input_ids, host)
    logprobs = trainer.row_model(input_ids, host)
    return compute_rl_loss(
        logprobs,
        to_device(row.inference_logprobs, device),
        to_device(row.advantages, device),
        to_device(row.loss_mask, device),
        row.lora_num_tokens,
        settings.loss_configs,
        loss_tokens_per_run=row.run_loss_tokens,
        position_ids=row.position_ids,
        samples_per_run=row.run_samples,
        constant_normalisers=settings.constants,
        base_logprobs=base_logprobs,
    )


def _backward_rows(
    trainer: Trainer,
    settings: _RunLossSettings,
    rows: list[MicroBatch | TinkerRow | TinkerPack],
    tally: StepTally,
    tinker_outputs: list[TinkerRowOutput] | None = None,
) -> None:
    """Every row's loss and its adapter gradients, accumulated in row order (a Tinker
    pack's, after every row, in datum order: `tinker_packing.py`)."""
    packs: list[TinkerPackOutput] = []

    def record(out: RLLossOutput | TinkerRowOutput | TinkerPackOutput) -> None:
        if isinstance(out, TinkerPackOutput):
            packs.append(out)
            if tinker_outputs is not None:
                tinker_outputs.extend(out.outputs)
        elif isinstance(out, TinkerRowOutput):
            if tinker_outputs is not None:
                tinker_outputs.append(out)
        else:
            tally.add(out)

    if trainer.row_threads is None:
        for row in rows:
            if isinstance(row, TinkerPack):
                out = pack_output(trainer, row)
            elif isinstance(row, TinkerRow):
                out = tinker_row_output(trainer, row)
                if row.grad:
                    out.loss.backward()
            else:
                out = _row_loss(trainer, settings, row)
                out.loss.backward()
            record(out)
        accumulate_in_datum_order(packs)
        return
    manager = trainer.manager

    # On the CPU, rows side by side: each row's adapter gradients come back to this thread
    # and are added in row order, the sums the loop above makes (row_threads.py).
    def row_gradients(row: MicroBatch | TinkerRow | TinkerPack):
        if isinstance(row, TinkerPack):
            return [], (), pack_output(trainer, row)
        if isinstance(row, TinkerRow):
            out = tinker_row_output(trainer, row)
            params = row_parameters(trainer, row)
            grads = torch.autograd.grad(out.loss, params, allow_unused=True) if params else ()
            return params, grads, out
        out = _row_loss(trainer, settings, row)
        params = [
            param
            for idx, tokens in enumerate(row.lora_num_tokens.tolist())
            if tokens
            for _, param in manager.get_named_parameters_for_run(idx)
        ]
        return params, torch.autograd.grad(out.loss, params, allow_unused=True), out

    with torch_threads(1):
        for params, grads, out in trainer.row_threads.map_in_order(row_gradients, rows):
            accumulate_in_order(params, grads)
            record(out)
    accumulate_in_datum_order(packs)


def run_filler_row(trainer: Trainer) -> None:
    """A forward and backward that changes no gradient, for the gathers of the other ranks."""
    row = filler_row(trainer.manager.max_runs)
    set_lora_num_tokens(trainer.model, row.lora_num_tokens)
    logprobs = trainer.row_model(
        to_device(row.input_ids, trainer.device),
        HostRow(row.position_ids, torch.ones(row.num_tokens)),
    )
    (logprobs.sum() * 0).backward()


# ---------------------------------------------------------------------- after an update


def publish_adapter(trainer: Trainer, idx: int) -> None:
    """Write the run's adapter at its current step as `broadcast/step_N` now (master only)."""
    adapter_copy(trainer, idx).write()


def algorithm_metrics(loss: LossConfig, stats: StepStats, idx: int) -> dict[str, object]:
    """The run's loss diagnostics for its metrics line: its kind, the share of loss tokens
    where its trust region acted (`clipped`; `masked` is its older name), the importance
    ratio's mean and extremes, and the KL estimate to the base where there is that term."""
    metrics: dict[str, object] = {
        "loss_kind": loss.kind,
        "clipped": round(stats.masked[idx], 4),
        # Four significant digits: a least ratio of 3e-5 is not 0.
        "ratio_mean": _significant(stats.ratio_mean[idx]),
        "ratio_min": _significant(stats.ratio_min[idx]),
        "ratio_max": _significant(stats.ratio_max[idx]),
    }
    if idx in stats.base_kl:
        metrics["base_kl"] = _significant(stats.base_kl[idx])
    return metrics


def _significant(value: float) -> float:
    return float(f"{value:.4g}")


def publish_updates(trainer: Trainer, stats: StepStats, step_s: float) -> None:
    """Master: broadcast each updated run's adapter, log its metrics, checkpoint if due.

    A run whose training diverged (`workbench.trainer.runs.divergence`: its loss or gradient
    norm not finite, or its gradient 0 although its advantages were not, for several
    updates in a row, or its adapter not finite) is evicted
    instead, its metrics still logged; its adapter of this update is not broadcast."""
    manager = trainer.manager
    # A run deleted while it trained is left out; the next discovery forgets it.
    ready = [idx for idx in manager.ready_to_update_idxs if manager.get_run_dir(idx).is_dir()]
    divergences = {
        idx: trainer.divergence.observe(
            idx,
            manager.progress[idx].step,
            stats.loss[idx],
            stats.grad_norm[idx],
            stats.stalled[idx],
        )
        for idx in ready
    }
    # Each run's previous adapter is written before this one is handed over (in order).
    evict_failed_writes(trainer, trainer.publisher.reap(wait_for=ready))
    for idx in ready:
        progress = manager.progress[idx]
        diverged = divergences[idx]
        try:
            if diverged is None:
                try:
                    copy = adapter_copy(trainer, idx, buffered=True)
                except NonFiniteWeights as err:
                    diverged = adapter_divergence(progress.step, err)
                else:
                    trainer.publisher.submit(idx, manager.idx_2_id[idx], copy)
            _log_run_update(trainer, idx, stats, step_s)
            if diverged is None:
                trainer.checkpointer.save_if_due(idx)
        except NonFiniteWeights as err:  # its checkpoint: the AdamW state is not finite
            diverged = adapter_divergence(progress.step, err)
        except OSError as err:
            # Disk full or the directory vanished: this run cannot go on, the others can.
            manager.evict_run(idx, f"the trainer could not write for this run: {err}")
        if diverged is not None:
            manager.evict_run(idx, diverged)


def wait_for_publications(trainer: Trainer) -> None:
    """Master: every adapter handed to the publisher written (or its run evicted)."""
    evict_failed_writes(trainer, trainer.publisher.reap(wait_all=True))


def log_unwritten(failures: list[FailedWrite]) -> None:
    """Say which adapters were not written, where their runs are leaving anyway (a stop, a
    run giving up its slot): a resumed run republishes its adapter from its checkpoint."""
    for failed in failures:
        logger.error("%s: its adapter of step %d was not written: %s",
                     failed.run_id, failed.step, failed.error)  # fmt: skip


def evict_failed_writes(trainer: Trainer, failures: list[FailedWrite]) -> None:
    """Evict each run whose adapter could not be written (disk full, its directory gone),
    if it still holds its slot; anything but an OSError is the trainer's own bug."""
    manager = trainer.manager
    for failed in failures:
        if not isinstance(failed.error, OSError):
            raise failed.error
        # A run deleted meanwhile is forgotten by the next discovery instead.
        still_there = manager.idx_2_id.get(failed.idx) == failed.run_id
        if still_there and manager.get_run_dir(failed.idx).is_dir():
            reason = f"the trainer could not write for this run: {failed.error}"
            manager.evict_run(failed.idx, reason)


def _log_run_update(trainer: Trainer, idx: int, stats: StepStats, step_s: float) -> None:
    """The run's trainer metrics line for this update, and its one log line."""
    manager = trainer.manager
    progress = manager.progress[idx]
    append_metrics(
        manager.get_run_dir(idx),
        "trainer",
        progress.step,
        loss=stats.loss[idx],
        grad_norm=stats.grad_norm[idx],
        lr=stats.lr[idx],
        masked=round(stats.masked[idx], 4),
        **algorithm_metrics(manager.config[idx].loss, stats, idx),
        tokens=progress.total_tokens,
        samples=progress.total_samples,
        step_s=round(step_s, 3),
    )
    # One line per run and update, its metrics line's figures (`tokens` so far).
    logger.info(
        "%s step %d loss %.4f grad_norm %.3f lr %.2e tokens %d step_s %.2f",
        manager.idx_2_id[idx],
        progress.step,
        stats.loss[idx],
        stats.grad_norm[idx],
        stats.lr[idx],
        progress.total_tokens,
        step_s,
    )


# ---------------------------------------------------------------------- the loop


def train_forever(trainer: Trainer) -> None:
    """Poll for runs and batches until SIGTERM; every rank runs this in lockstep."""
    busy.ready("waiting for rollouts", busy.WAITING)  # between updates: polling included
    while (outcome := iterate(trainer)) != "stopped":
        if outcome == "idle":
            wait_for_tinker_work(trainer, trainer.config.trainer.poll_interval_s)


def iterate(trainer: Trainer) -> str:
    """One pass: discover runs, collect ready batches, train them. Returns what happened:
    "trained", "idle" (no run had a batch) or "stopped" (checkpoints written)."""
    manager = trainer.manager
    world = distributed.world_size()
    if manager.is_master:
        evict_failed_writes(trainer, trainer.publisher.reap())
        manager.discover_runs()
    manager.synchronize_state()  # creation hooks: optimizers, schedules, resumes
    shares: list[list[MicroBatch]] = [[] for _ in range(world)]
    tinker = TinkerPass()
    # Read once, before collecting: collecting advances each run's step, so a batch collected
    # and then not trained because a signal came in between would be checkpointed as trained
    # (and skipped on resume). A signal after this line stops the next pass instead.
    stopping = trainer.stop_requested
    if manager.is_master and not stopping:
        shares = trainer.packer.pack(trainer.packer.collect(), world)
        tinker = collect_tinker_work(trainer)
    manager.synchronize_state()  # progress and ready flags of what was collected
    payload = distributed.broadcast_from_master(
        {"stop": stopping, "shares": shares, "tinker": tinker}
    )
    if payload["stop"]:
        if manager.is_master:
            log_unwritten(trainer.publisher.reap(wait_all=True))
            for idx in manager.used_idxs:
                try:
                    trainer.checkpointer.save_if_due(idx, force=True)
                except NonFiniteWeights as err:  # its latest finite checkpoint stays
                    logger.error("%s: %s", manager.idx_2_id[idx], err)
        # The ranks leave together: none tears down its side of the process group while
        # the master still writes checkpoints (how they leave it: destroy_process_group).
        distributed.barrier()
        logger.info("stopping: checkpoints written")
        return "stopped"
    tinker = payload["tinker"]
    if not manager.ready_to_update_idxs and not tinker:
        return "idle"
    started = time.monotonic()
    shares = payload["shares"]
    # In datum order, on the master (tinker_work.py), in shared rows where it packs them.
    tinker_rows = pass_rows(trainer, tinker.rows) if distributed.rank() == 0 else tinker.rows
    shares[0] = shares[0] + tinker_rows
    tinker_outputs: list[TinkerRowOutput] = []
    with busy.doing("update"):  # a no-op on ranks that keep no busy record
        start_tinker_pass(trainer, tinker)
        stats = train_step(
            trainer, shares[distributed.rank()], max(map(len, shares)), tinker_outputs
        )
        if manager.is_master:
            with busy.doing("publishing adapters"):  # copied out, handed to the writers
                publish_updates(trainer, stats, time.monotonic() - started)
        finish_tinker_pass(trainer, tinker, tinker_outputs)
    for idx in manager.ready_to_update_idxs:
        manager.ready_to_update[idx] = False
    return "trained"


# ---------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchrun -m workbench.trainer.rl.trainer", description=__doc__
    )
    parser.add_argument("--config", type=Path, required=True, help="a TrainerConfig TOML")
    args = parser.parse_args(argv)
    # torchrun starts each worker in a session of its own: without this a killed agent
    # would leave it training beside the trainer that replaces it.
    die_with_parent()
    run_as_batch()
    device = distributed.init_process_group()
    try:
        return train_from_config(args.config, device)
    finally:
        distributed.destroy_process_group()


def train_from_config(config_path: Path, device: torch.device) -> int:
    """The trainer on this rank, once the process group (if any) is up; returns the exit status."""
    rank = distributed.rank()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_trainer_config(config_path)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if distributed.is_master():
        remove_killed_writes(config.output_dir)
        busy.record_to(config.output_dir, "trainer")
    torch.manual_seed(0)
    dtype = getattr(torch, config.trainer.dtype)
    base = load_base_model(config.model.base, dtype, device, config.output_dir)
    trainer = build_trainer(config, base, device)

    def request_stop(signum, frame):
        logger.info("signal %d: finishing the current step, then checkpointing", signum)
        trainer.stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    train_forever(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
