"""The recipe's configuration: pydantic models by section, and TOML reading with located errors.

Bad input raises `ConfigError`, whose message names the file, the key and, where the source
gives it, the line, and says what to do. Nothing here touches a process: the supervisor,
trainer and orchestrators import it. Every name is re-exported here, so callers import
`workbench.config` and not its modules:

- `loading`: `ConfigError`, tomlkit I/O (`read_toml`, `model_to_toml`), merging `[defaults]`
  and dotted assignments, and turning a pydantic error into located problems;
- `base`: `StrictModel`, the `[experiment]` and `[model]` sections, LoRA and run ids;
- `run`: `OrchestratorConfig`, one run's `control/orch.toml` and the recipe's `[defaults]`,
  with its sampling, eval, optimizer, scheduler and advantages;
- `loss`: a run's `loss` table, one class per `loss.kind` on the common `LossConfig`;
- `inference`: the `[inference]` section and what the supervisor hands vLLM;
- `trainer`: the `[trainer]` section and what the supervisor hands the trainer;
- `tracking`: the `[tracking]` section;
- `alerts`: the `[alerts]` section;
- `slurm`: the `[slurm]` section, which only `workbench slurm` reads;
- `user_code`: importing a loss or an environment the recipe names as `package.module:name`.

The recipe itself, its `[[runs]]` and its `[sweep]` are assembled in `workbench.recipe`.
"""

from __future__ import annotations

from workbench.config.alerts import ALERT_RULES, AlertsSection
from workbench.config.base import (
    LORA_TARGET_MODULES,
    MAX_RUN_ID_CHARS,
    ExperimentSection,
    LoraConfig,
    ModelSection,
    StrictModel,
    check_run_id,
    lora_rank_problem,
    normalize_run_id,
)
from workbench.config.inference import (
    MAX_ADAPTERS_IN_FLIGHT,
    VLLM_MAX_LORA_RANKS,
    InferenceConfig,
    InferenceSection,
    default_max_loras,
    load_inference_config,
    served_lora_rank,
    served_rank_problem,
)
from workbench.config.loading import (
    ConfigError,
    ConfigProblem,
    config_loc,
    deep_merge,
    explain_error,
    load_partial,
    model_to_toml,
    nest_dotted,
    parse_assignment,
    parse_toml,
    problem_at,
    problems_from_validation,
    read_toml,
    tagged_members,
    validate_model,
)
from workbench.config.loss import (
    LOSS_KINDS,
    USER_KIND,
    CispoLoss,
    DefaultLoss,
    GspoLoss,
    IsLoss,
    LossConfig,
    PpoLoss,
    ReinforceLoss,
    UserLoss,
    loss_config,
)
from workbench.config.run import (
    GREEDY_TRAINING,
    GROUP_OF_ONE,
    MAX_EVAL_PROMPTS,
    AdvantageConfig,
    EvalConfig,
    EvalSamplingConfig,
    ForkedFrom,
    OptimizerConfig,
    OrchestratorConfig,
    RunLoraConfig,
    SamplingConfig,
    SamplingParams,
    SchedulerConfig,
    load_orchestrator_config,
)
from workbench.config.slurm import SlurmSection
from workbench.config.tracking import TrackingSection
from workbench.config.trainer import (
    MAX_POLL_INTERVAL_S,
    PROMPT_SHARING_ATTENTION,
    TrainerConfig,
    TrainerSection,
    load_trainer_config,
)

__all__ = [
    "ALERT_RULES",
    "GREEDY_TRAINING",
    "GROUP_OF_ONE",
    "LORA_TARGET_MODULES",
    "LOSS_KINDS",
    "MAX_ADAPTERS_IN_FLIGHT",
    "MAX_EVAL_PROMPTS",
    "MAX_POLL_INTERVAL_S",
    "MAX_RUN_ID_CHARS",
    "PROMPT_SHARING_ATTENTION",
    "USER_KIND",
    "VLLM_MAX_LORA_RANKS",
    "AdvantageConfig",
    "AlertsSection",
    "CispoLoss",
    "ConfigError",
    "ConfigProblem",
    "DefaultLoss",
    "EvalConfig",
    "EvalSamplingConfig",
    "ExperimentSection",
    "ForkedFrom",
    "GspoLoss",
    "InferenceConfig",
    "InferenceSection",
    "IsLoss",
    "LoraConfig",
    "LossConfig",
    "ModelSection",
    "OptimizerConfig",
    "OrchestratorConfig",
    "PpoLoss",
    "ReinforceLoss",
    "RunLoraConfig",
    "SamplingConfig",
    "SamplingParams",
    "SchedulerConfig",
    "SlurmSection",
    "StrictModel",
    "TrackingSection",
    "TrainerConfig",
    "TrainerSection",
    "UserLoss",
    "check_run_id",
    "config_loc",
    "deep_merge",
    "default_max_loras",
    "explain_error",
    "load_inference_config",
    "load_orchestrator_config",
    "load_partial",
    "load_trainer_config",
    "lora_rank_problem",
    "loss_config",
    "model_to_toml",
    "nest_dotted",
    "normalize_run_id",
    "parse_assignment",
    "parse_toml",
    "problem_at",
    "problems_from_validation",
    "read_toml",
    "served_lora_rank",
    "served_rank_problem",
    "tagged_members",
    "validate_model",
]
