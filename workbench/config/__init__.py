"""The recipe's configuration: pydantic models by section, and TOML reading with located errors.

Bad input raises `ConfigError`, whose message names the file, the key and, where the source
gives it, the line, and says what to do. Nothing here touches a process: the supervisor,
trainer and orchestrators import it. Every name is re-exported here, so callers import
`workbench.config` and not its modules:

- `loading`: `ConfigError`, tomlkit I/O (`read_toml`, `model_to_toml`), merging `[defaults]`
  and dotted assignments, and turning a pydantic error into located problems;
- `base`: `StrictModel`, the `[experiment]` and `[model]` sections, LoRA and run ids;
- `run`: `OrchestratorConfig`, one run's `control/orch.toml` and the recipe's `[defaults]`,
  with its sampling, eval, optimizer, scheduler and loss;
- `inference`: the `[inference]` section and what the supervisor hands vLLM;
- `trainer`: the `[trainer]` section and what the supervisor hands the trainer;
- `tracking`: the `[tracking]` section;
- `slurm`: the `[slurm]` section, which only `workbench slurm` reads.

The recipe itself, its `[[runs]]` and its `[sweep]` are assembled in `workbench.recipe`.
"""

from __future__ import annotations

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
    validate_model,
)
from workbench.config.run import (
    GREEDY_TRAINING,
    GROUP_OF_ONE,
    LOSS_KIND_KNOBS,
    MAX_EVAL_PROMPTS,
    AdvantageConfig,
    EvalConfig,
    EvalSamplingConfig,
    ForkedFrom,
    LossConfig,
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
    "GREEDY_TRAINING",
    "GROUP_OF_ONE",
    "LORA_TARGET_MODULES",
    "LOSS_KIND_KNOBS",
    "MAX_ADAPTERS_IN_FLIGHT",
    "MAX_EVAL_PROMPTS",
    "MAX_POLL_INTERVAL_S",
    "MAX_RUN_ID_CHARS",
    "PROMPT_SHARING_ATTENTION",
    "VLLM_MAX_LORA_RANKS",
    "AdvantageConfig",
    "ConfigError",
    "ConfigProblem",
    "EvalConfig",
    "EvalSamplingConfig",
    "ExperimentSection",
    "ForkedFrom",
    "InferenceConfig",
    "InferenceSection",
    "LoraConfig",
    "LossConfig",
    "ModelSection",
    "OptimizerConfig",
    "OrchestratorConfig",
    "RunLoraConfig",
    "SamplingConfig",
    "SamplingParams",
    "SchedulerConfig",
    "SlurmSection",
    "StrictModel",
    "TrackingSection",
    "TrainerConfig",
    "TrainerSection",
    "check_run_id",
    "deep_merge",
    "default_max_loras",
    "explain_error",
    "load_inference_config",
    "load_orchestrator_config",
    "load_partial",
    "load_trainer_config",
    "lora_rank_problem",
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
    "validate_model",
]
