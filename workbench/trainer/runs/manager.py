"""The multi-run manager: which run holds which adapter slot, on every trainer rank.

Names and behaviour follow the multi-run manager of prime-rl's trainer (`MultiRunManager`):

- the master rank scans the experiment directory (`discover_runs`): deleted, evicted,
  finished and rejected runs are forgotten (a run's orchestrator rejects its config when
  the environment cannot be built), new `run_*` directories with a valid
  `control/orch.toml` get a free slot, invalid ones get
  `control/config_validation_error.txt`; a rejected run is looked at again once its
  `orch.toml` changes (the run's condition, `run_control.run_condition`, says which runs
  are open to the trainer); when every slot is used new runs wait, without error, until
  one frees;
- every rank then calls `synchronize_state`, which copies the master's view through the
  torch distributed store and runs deletion hooks before creation hooks, in registration
  order, on all ranks together;
- LoRA modules register themselves so optimizers, broadcast and resets can ask for one
  run's parameters.

`setup_multi_run_manager(output_dir, max_runs)` and `get_multi_run_manager()` are prime-rl's
entry points to one manager per process; the trainer builds its own and passes it on.

Hook order on the master: forgotten -> validation -> discovered. A validation or discovered
hook that raises rejects that run's config (the exception goes to the error file); a
creation hook that raises rejects the run at the next discovery. Neither kills the trainer.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from workbench.config import (
    ConfigError,
    OrchestratorConfig,
    check_run_id,
    load_orchestrator_config,
)
from workbench.files import layout, run_control
from workbench.system.clock import now_iso
from workbench.trainer.parallel import distributed

logger = logging.getLogger(__name__)

DiscoveredHook = Callable[[int, str, OrchestratorConfig], None]
RunHook = Callable[[int, str], None]
ValidationHook = Callable[[OrchestratorConfig], tuple[bool, str]]
_STORE_PREFIX = "workbench/runs"


@dataclass
class Progress:
    """How far the trainer has taken one run."""

    step: int = 0
    total_tokens: int = 0
    total_samples: int = 0


class LoRAModule(Protocol):
    """What a multi-adapter layer offers the manager (implemented by MultiLoRALinear)."""

    def named_parameters_for_adapter(
        self, idx: int
    ) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def state_dict_for_adapter(self, idx: int, *, copy: bool = True) -> dict[str, torch.Tensor]: ...

    def reset_parameters_for_adapter(self, idx: int) -> None: ...


@dataclass(frozen=True)
class _Admission:
    """One run holding one slot. `uid` tells a run that left and came back from one that stayed."""

    run_id: str
    uid: int


class MultiRunManager:
    def __init__(
        self,
        output_dir: Path,
        max_runs: int,
        *,
        store: Any | None = None,
        config_loader: Callable[[Path], OrchestratorConfig] = load_orchestrator_config,
    ):
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        self.output_dir = Path(output_dir)
        self.max_runs = max_runs
        self.rank = distributed.rank()
        self.world_size = distributed.world_size()
        self._store = store
        if self._store is None and self.world_size > 1:
            self._store = dist.distributed_c10d._get_default_store()
        self._config_loader = config_loader

        self.idx_2_id: dict[int, str] = {}
        self.id_2_idx: dict[str, int] = {}
        self.progress: dict[int, Progress] = {}
        self.config: dict[int, OrchestratorConfig] = {}
        self.ready_to_update: list[bool] = [False] * max_runs
        self.waiting_run_ids: list[str] = []

        self._admissions: dict[int, _Admission] = {}
        self._synced: dict[int, _Admission] = {}
        self._next_uid = 0
        # orch.toml (mtime, size) of each rejected run, so an unchanged bad config is not
        # re-read on every scan but a fixed one is retried at once.
        self._rejected_signature: dict[str, tuple[int, int]] = {}
        self._failed_creation: dict[int, str] = {}
        self._sync_generation = 0
        self._acked_generations: list[int] = []
        self._published: str | None = None

        self._lora_modules: dict[str, LoRAModule] = {}
        # Each slot's named adapter parameters, listed once: the training loop asks for them
        # several times an update per run (rows, clipping, zeroing, all-reduce), and listing
        # them each time grew with the runs. A slot's parameters are the same objects for
        # the trainer's life (its optimizer holds them; a new run resets them in place;
        # FSDP leaves them out of its sharding), so only registering another module
        # changes the lists.
        self._named_parameters: dict[int, list[tuple[str, torch.nn.Parameter]]] = {}
        self._discovered_hooks: list[DiscoveredHook] = []
        self._forgotten_hooks: list[RunHook] = []
        self._creation_hooks: list[RunHook] = []
        self._deletion_hooks: list[RunHook] = []
        self._validation_hooks: list[ValidationHook] = []

    # ------------------------------------------------------------------ views

    @property
    def is_master(self) -> bool:
        """The rank that discovers runs; the same rank as `distributed.is_master()`."""
        return self.rank == 0

    @property
    def used_idxs(self) -> list[int]:
        return sorted(self.idx_2_id)

    @property
    def unused_idxs(self) -> list[int]:
        return [idx for idx in range(self.max_runs) if idx not in self.idx_2_id]

    @property
    def ready_to_update_idxs(self) -> list[int]:
        return [idx for idx in self.used_idxs if self.ready_to_update[idx]]

    def get_run_dir(self, idx: int) -> Path:
        return layout.run_dir(self.output_dir, self.idx_2_id[idx])

    # ------------------------------------------------------------------ hooks

    def register_discovered_hook(self, hook: DiscoveredHook) -> None:
        self._discovered_hooks.append(hook)

    def register_forgotten_hook(self, hook: RunHook) -> None:
        self._forgotten_hooks.append(hook)

    def register_creation_hook(self, hook: RunHook) -> None:
        self._creation_hooks.append(hook)

    def register_deletion_hook(self, hook: RunHook) -> None:
        self._deletion_hooks.append(hook)

    def register_config_validation_hook(self, hook: ValidationHook) -> None:
        self._validation_hooks.append(hook)

    # ------------------------------------------------------------------ discovery (master)

    def discover_runs(self) -> None:
        """Master only: forget deleted, evicted, finished or rejected runs, admit new valid
        ones into free slots."""
        if not self.is_master:
            raise RuntimeError(
                "discover_runs() runs on the master rank only; other ranks call synchronize_state()"
            )
        # Evicted and rejected runs leave; so do finished ones (their orchestrator writes
        # finished.txt after the trainer's last adapter), freeing the slot for a waiting
        # run. Only an open run keeps its slot: one rejected since it was admitted leaves
        # even when its orch.toml was edited after the rejection, and that edited file is
        # then validated below like any waiting run's (which clears the rejection).
        conditions = {
            path.name: (path, run_control.run_condition(path))
            for path in layout.list_run_dirs(self.output_dir)
        }
        present = {run_id: path for run_id, (path, c) in conditions.items() if c.open_to_trainer}
        open_runs = {
            run_id for run_id, (_, c) in conditions.items() if c.kind is run_control.Condition.OPEN
        }
        for idx, run_id in sorted(self.idx_2_id.items()):
            if run_id not in open_runs or idx in self._failed_creation:
                self._forget(idx, run_id)

        waiting = []
        for run_id, path in self._candidates(present):
            config = self._validated_config(run_id, path)
            if config is None:
                continue
            if not self.unused_idxs:
                waiting.append(run_id)
                continue
            self._admit(min(self.unused_idxs), run_id, path, config)
        self.waiting_run_ids = waiting

    def _candidates(self, present: dict[str, Path]) -> list[tuple[str, Path]]:
        """New run directories that finished their handshake, oldest config first (FIFO)."""
        candidates = []
        for run_id, path in present.items():
            if run_id in self.id_2_idx:
                continue
            try:
                stat = layout.orch_config_path(path).stat()
            except (FileNotFoundError, NotADirectoryError):
                continue  # orch.toml not written yet: not a run so far
            candidates.append((stat.st_mtime_ns, run_id, path))
        return [(run_id, path) for _, run_id, path in sorted(candidates)]

    def _validated_config(self, run_id: str, path: Path) -> OrchestratorConfig | None:
        config_path = layout.orch_config_path(path)
        try:
            stat = config_path.stat()
        except FileNotFoundError:
            return None
        signature = (stat.st_mtime_ns, stat.st_size)
        if self._rejected_signature.get(run_id) == signature:
            return None
        error = None
        bad_id = check_run_id(run_id)
        config = None
        if bad_id:
            error = f"{path}: {bad_id}; rename the directory"
        else:
            config, error = self._load_and_validate(config_path)
        if error is not None:
            self._reject(run_id, path, error, stat)
            return None
        self._rejected_signature.pop(run_id, None)
        run_control.clear_validation_error(path)
        return config

    def _load_and_validate(self, config_path: Path) -> tuple[OrchestratorConfig | None, str | None]:
        try:
            config = self._config_loader(config_path)
        except ConfigError as err:
            return None, str(err)
        except Exception as err:  # a broken loader must not take the trainer down
            return None, f"{config_path}: could not load: {type(err).__name__}: {err}"
        for hook in self._validation_hooks:
            try:
                ok, message = hook(config)
            except Exception as err:
                return None, f"{config_path}: " + _hook_failure(
                    f"validation hook {_hook_name(hook)}", err
                )
            if not ok:
                return None, f"{config_path}: {message or 'rejected by ' + _hook_name(hook)}"
        return config, None

    def _reject(self, run_id: str, path: Path, error: str, config: os.stat_result) -> None:
        """Reject the run's config, the `control/orch.toml` that `config` is a stat of."""
        logger.warning("run %s rejected: %s", run_id, error)
        self._rejected_signature[run_id] = (config.st_mtime_ns, config.st_size)
        try:
            run_control.write_validation_error(path, error, run_control.config_signature(config))
        except OSError as err:  # the directory may be gone already
            logger.warning("could not write the validation error of %s: %s", run_id, err)

    def _admit(self, idx: int, run_id: str, path: Path, config: OrchestratorConfig) -> None:
        self._create_run_data(idx, run_id, self._next_uid, config)
        self._next_uid += 1
        logger.info("run %s discovered: slot %d", run_id, idx)
        for hook in self._discovered_hooks:
            try:
                hook(idx, run_id, config)
            except Exception as err:
                error = _hook_failure(f"discovered hook {_hook_name(hook)}", err)
                self._forget(idx, run_id, call_hooks=False)
                stat = layout.orch_config_path(path).stat()
                self._reject(run_id, path, error, stat)
                return

    def _forget(self, idx: int, run_id: str, *, call_hooks: bool = True) -> None:
        failure = self._failed_creation.pop(idx, None)
        if failure is not None:
            path = layout.run_dir(self.output_dir, run_id)
            try:
                stat = layout.orch_config_path(path).stat()
                self._reject(run_id, path, failure, stat)
            except FileNotFoundError:
                pass
        logger.info("run %s forgotten: slot %d is free", run_id, idx)
        if call_hooks:
            for hook in self._forgotten_hooks:
                _call_logged(hook, idx, run_id)
        self._delete_run_data(idx)

    # ------------------------------------------------------------------ eviction

    def evict_run(self, idx: int, reason: str) -> None:
        """Master only: write `evicted.txt`; the run leaves at the next `discover_runs()`."""
        if not self.is_master:
            raise RuntimeError("evict_run() runs on the master rank only")
        run_id = self.idx_2_id[idx]
        logger.warning("evicting run %s (slot %d): %s", run_id, idx, reason)
        run_control.write_eviction(self.get_run_dir(idx), reason, by="trainer")

    # ------------------------------------------------------------------ synchronisation (all ranks)

    def synchronize_state(self) -> None:
        """All ranks: adopt the master's view, then run deletion hooks, then creation hooks."""
        generation = self._sync_generation
        self._sync_generation += 1
        created_before = {
            idx for idx, adm in self._admissions.items() if self._synced.get(idx) != adm
        }
        if self.world_size > 1:
            key = f"{_STORE_PREFIX}/state/{generation}"
            if self.is_master:
                self._store.set(key, json.dumps(self._state_payload(created_before)))
                self._drop_acknowledged_generations(generation)
            else:
                self._apply_payload(json.loads(self._store.get(key)))
                self._store.add(f"{_STORE_PREFIX}/ack/{generation}", 1)

        deleted = sorted(
            (idx, adm.run_id)
            for idx, adm in self._synced.items()
            if self._admissions.get(idx) != adm
        )
        created = sorted(
            (idx, adm.run_id)
            for idx, adm in self._admissions.items()
            if self._synced.get(idx) != adm
        )
        for idx, run_id in deleted:
            for hook in self._deletion_hooks:
                _call_logged(hook, idx, run_id)
        for idx, run_id in created:
            self.reset_run_parameters(idx)
            for hook in self._creation_hooks:
                try:
                    hook(idx, run_id)
                except Exception as err:
                    message = f"setting up run {run_id} in the trainer failed: " + _hook_failure(
                        f"creation hook {_hook_name(hook)}", err
                    )
                    logger.error(message)
                    self._failed_creation[idx] = message
                    break
        self._synced = dict(self._admissions)
        if self.is_master:
            self.publish_state()

    def _state_payload(self, new_idxs: set[int]) -> dict[str, Any]:
        return {
            "admissions": {idx: [adm.run_id, adm.uid] for idx, adm in self._admissions.items()},
            "progress": {idx: asdict(p) for idx, p in self.progress.items()},
            "ready_to_update": self.ready_to_update,
            # Only new runs ship their config: the others' configs are already everywhere.
            "configs": {idx: self.config[idx].model_dump(mode="json") for idx in new_idxs},
        }

    def _apply_payload(self, payload: dict[str, Any]) -> None:
        admissions = {
            int(idx): _Admission(run_id, uid)
            for idx, (run_id, uid) in payload["admissions"].items()
        }
        for idx in [idx for idx, adm in self._admissions.items() if admissions.get(idx) != adm]:
            self._delete_run_data(idx)
        for idx, adm in sorted(admissions.items()):
            if self._admissions.get(idx) != adm:
                config = OrchestratorConfig.model_validate(payload["configs"][str(idx)])
                self._create_run_data(idx, adm.run_id, adm.uid, config)
        for idx, progress in payload["progress"].items():
            self.progress[int(idx)] = Progress(**progress)
        self.ready_to_update = list(payload["ready_to_update"])

    def _drop_acknowledged_generations(self, current: int) -> None:
        """Delete old state keys every other rank has read, so the store does not grow."""
        self._acked_generations.append(current)
        keep = []
        for generation in self._acked_generations:
            if generation == current:
                keep.append(generation)
                continue
            acks = self._store.add(f"{_STORE_PREFIX}/ack/{generation}", 0)
            if acks >= self.world_size - 1:
                self._store.delete_key(f"{_STORE_PREFIX}/state/{generation}")
                self._store.delete_key(f"{_STORE_PREFIX}/ack/{generation}")
            else:
                keep.append(generation)
        self._acked_generations = keep

    def _create_run_data(self, idx: int, run_id: str, uid: int, config: OrchestratorConfig) -> None:
        self._admissions[idx] = _Admission(run_id, uid)
        self.idx_2_id[idx] = run_id
        self.id_2_idx[run_id] = idx
        self.progress[idx] = Progress()
        self.config[idx] = config
        self.ready_to_update[idx] = False

    def _delete_run_data(self, idx: int) -> None:
        self._admissions.pop(idx, None)
        run_id = self.idx_2_id.pop(idx, None)
        if run_id is not None and self.id_2_idx.get(run_id) == idx:
            del self.id_2_idx[run_id]
        self.progress.pop(idx, None)
        self.config.pop(idx, None)
        self.ready_to_update[idx] = False

    def publish_state(self) -> None:
        """Master: write `trainer/runs.json` (slots, progress, waiting runs) for the CLI and TUI."""
        state = {
            "max_runs": self.max_runs,
            "pid": os.getpid(),
            "slots": {str(idx): run_id for idx, run_id in sorted(self.idx_2_id.items())},
            "progress": {self.idx_2_id[idx]: asdict(p) for idx, p in sorted(self.progress.items())},
            "waiting": self.waiting_run_ids,
        }
        text = json.dumps(state, indent=2, sort_keys=True)
        if text == self._published:
            return
        try:
            layout.atomic_write_text(
                layout.trainer_state_path(self.output_dir),
                json.dumps({**state, "updated_at": now_iso()}, indent=2, sort_keys=True),
            )
            self._published = text
        except OSError as err:  # a full disk must not stop training; the next sync retries
            logger.warning("could not publish trainer state: %s", err)

    # ------------------------------------------------------------------ LoRA registration

    def register_lora_module(self, name: str, module: LoRAModule) -> None:
        if name in self._lora_modules:
            raise ValueError(f"a LoRA module named {name!r} is already registered")
        self._lora_modules[name] = module
        self._named_parameters.clear()

    def get_named_parameters_for_run(self, idx: int) -> list[tuple[str, torch.nn.Parameter]]:
        """Slot `idx`'s adapter parameters, peft-named; a new list each call, of the same
        parameters."""
        listed = self._named_parameters.get(idx)
        if listed is None:
            self._check_idx(idx)
            listed = self._named_parameters[idx] = [
                (f"{name}.{param_name}", param)
                for name, module in self._lora_modules.items()
                for param_name, param in module.named_parameters_for_adapter(idx)
            ]
        return list(listed)

    def get_state_dict_for_run(self, idx: int, *, copy: bool = True) -> dict[str, torch.Tensor]:
        """The run's adapter, peft-named; with `copy=False` views of its slot (see
        `LoRAModule.state_dict_for_adapter`; a module written for prime-rl's protocol,
        which has no `copy`, is asked for copies as there)."""
        self._check_idx(idx)
        views = {} if copy else {"copy": False}
        return {
            f"{name}.{key}": tensor
            for name, module in self._lora_modules.items()
            for key, tensor in module.state_dict_for_adapter(idx, **views).items()
        }

    def reset_run_parameters(self, idx: int) -> None:
        self._check_idx(idx)
        for module in self._lora_modules.values():
            module.reset_parameters_for_adapter(idx)

    def _check_idx(self, idx: int) -> None:
        if not 0 <= idx < self.max_runs:
            raise IndexError(f"run index {idx} is outside 0..{self.max_runs - 1}")


# ---------------------------------------------------------------------- the seed's entry points

# prime-rl's trainer makes one manager per process and finds it anywhere through these two
# (seed 000, "Initialization and run discovery"). workbench's trainer builds its own and
# passes it on (`rl.build_trainer`); these serve code written against prime-rl's API.
_manager: MultiRunManager | None = None


def setup_multi_run_manager(output_dir: Path, max_runs: int, **kwargs: Any) -> MultiRunManager:
    """Make this process's manager (`MultiRunManager(output_dir, max_runs, **kwargs)`) and
    return it; `get_multi_run_manager` finds it from then on. Called again, it replaces it."""
    global _manager
    _manager = MultiRunManager(output_dir, max_runs, **kwargs)
    return _manager


def get_multi_run_manager() -> MultiRunManager:
    """The manager `setup_multi_run_manager` made in this process."""
    if _manager is None:
        raise RuntimeError(
            "this process has no multi-run manager yet: call "
            "setup_multi_run_manager(output_dir, max_runs) first"
        )
    return _manager


# ---------------------------------------------------------------------- helpers


def _hook_failure(hook: str, err: Exception) -> str:
    """A hook's failure as a run's reason: the exception's own message on the first line,
    which is the line status and the TUI show, then where it was raised."""
    first = f"{type(err).__name__}: {err}".strip().splitlines()[0]
    return f"{first} (raised by the {hook})\n" + traceback.format_exc(limit=5)


def _hook_name(hook: Callable[..., Any]) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


def _call_logged(hook: Callable[..., None], *args: Any) -> None:
    """Run a bookkeeping hook; a failure is logged, never raised into the training loop."""
    try:
        hook(*args)
    except Exception:
        logger.exception("hook %s failed for %s", _hook_name(hook), args)
