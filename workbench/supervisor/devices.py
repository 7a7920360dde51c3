"""Which GPUs run vLLM and which the trainer: the recipe's lists checked against the
machine (`device_problems`) and the assignment the plan starts processes with
(`assign_devices`). Apart from the plan so that slot sizing (`supervisor.slots`), which the
plan calls, can place the same devices without importing the plan."""

from __future__ import annotations

from dataclasses import dataclass


class PlanError(Exception):
    """The recipe cannot be turned into processes on this machine (the message says why)."""


@dataclass(frozen=True)
class DeviceAssignment:
    """GPU indices for each process; None means CUDA_VISIBLE_DEVICES is left unset."""

    inference: list[int] | None
    trainer: list[int] | None


def assign_devices(
    inference_gpus: list[int],
    trainer_gpus: list[int],
    trainer_ranks: int,
    gpu_count: int,
    inference_size: int = 1,
) -> DeviceAssignment:
    """Inference first (`inference_size` GPUs: tensor x data parallel), the trainer next;
    share when there are not enough GPUs to keep them apart; none on CPU."""
    if gpu_count == 0:
        return DeviceAssignment(None, None)
    problems = device_problems(
        inference_gpus, trainer_gpus, trainer_ranks, gpu_count, inference_size
    )
    if problems:
        raise PlanError(f"recipe {problems[0][1]}")
    inference = list(inference_gpus) or list(range(inference_size))
    if trainer_gpus:
        trainer = list(trainer_gpus)
    else:
        spare = [gpu for gpu in range(gpu_count) if gpu not in inference]
        if len(spare) >= trainer_ranks:
            trainer = spare[:trainer_ranks]
        else:  # not enough GPUs to keep them apart: share, as on a single-GPU box
            trainer = list(range(gpu_count))[:trainer_ranks]
    return DeviceAssignment(inference, trainer)


def device_problems(
    inference_gpus: list[int],
    trainer_gpus: list[int],
    trainer_ranks: int,
    gpu_count: int,
    inference_size: int = 1,
) -> list[tuple[str, str]]:
    """What is wrong with the recipe's GPU lists and vLLM's parallelism on a machine with
    `gpu_count` GPUs, as (dotted key, message). Without GPUs the lists are ignored, but
    parallelism across GPUs cannot be had."""
    parallel = (
        f"[inference] tensor_parallel_size x data_parallel_size = {inference_size} GPUs for vLLM"
    )
    if gpu_count == 0:
        if inference_size > 1:
            return [
                (
                    "inference.tensor_parallel_size",
                    f"{parallel}, but this machine has no GPU; set both to 1",
                )
            ]
        return []
    problems = []
    for key, gpus in (("inference.gpus", inference_gpus), ("trainer.gpus", trainer_gpus)):
        bad = [gpu for gpu in gpus if not 0 <= gpu < gpu_count]
        if bad:
            section, name = key.split(".")
            problems.append(
                (
                    key,
                    f"[{section}] {name} lists {bad}, but this machine has {gpu_count} GPU(s) "
                    f"(0-{gpu_count - 1}); fix the list or leave it empty to assign "
                    "automatically",
                )
            )
    if inference_size > gpu_count:
        problems.append(
            (
                "inference.tensor_parallel_size",
                f"{parallel}, but this machine has {gpu_count}; lower them",
            )
        )
    elif inference_gpus and len(inference_gpus) != inference_size:
        problems.append(
            (
                "inference.gpus",
                f"[inference] gpus lists {len(inference_gpus)} GPU(s) {inference_gpus}, but "
                f"{parallel}; list exactly that many or leave the list empty",
            )
        )
    if trainer_gpus and len(trainer_gpus) < trainer_ranks:
        problems.append(
            (
                "trainer.gpus",
                f"[trainer] nproc_per_node = {trainer_ranks} needs that many GPUs, but "
                f"[trainer] gpus lists {trainer_gpus}; list more GPUs or lower nproc_per_node",
            )
        )
    return problems
