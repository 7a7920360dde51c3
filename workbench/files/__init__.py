"""The experiment directory's files: the contracts between the processes.

`layout` says where each file lives; the other modules own one format each, written
atomically by one process and read by the others: `metrics`, `rollouts`, `run_control` (a
run's control files and condition), `samples`, `eval_samples` (each eval's prompts and
completions), `busy`, `spans` (every activity, whole), `trace`
(them as a Chrome trace), `experiment_changes` (which runs
changed since the last look), `endpoint` (where the server listens), `nodes` (the
trainer's joined nodes), `alerts` (`alerts.jsonl`) and `tinker_work` (a Tinker client's
work items for the trainer and their results)."""
