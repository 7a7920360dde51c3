"""A local Tinker-compatible HTTP service (`workbench serve`, docs/guides/tinker.md).

The unmodified `tinker` SDK connects to it; each training client it makes is a run of the
experiment (`source = "tinker"`), whose commands reach the shared trainer as work items
(`workbench.files.tinker_work`). One module per idea: `wire` (protobuf, JSON and zstd
bodies), `http` (settings, errors, reading a body), `futures` (request ids and
try-again), `sessions` (heartbeats), `models` (model ids, seq_id order), `app` (the
service and its training routes), `routes` (sampling and checkpoint routes), `sampling`
(through the experiment's vLLM, pinned to a checkpoint), `checkpoints` (`tinker://`
paths) and `__main__` (the process, which the supervisor starts:
`workbench.supervisor.tinker_service`).
"""
