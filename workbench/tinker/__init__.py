"""A local Tinker-compatible HTTP service (`workbench serve`, docs/guides/tinker.md).

The unmodified `tinker` SDK connects to it; each training client it makes is a run of the
experiment (`source = "tinker"`), whose commands reach the shared trainer as work items
(`workbench.files.tinker_work`). One module per idea: `wire` (bodies), `futures`,
`sessions`, `models` (model ids, seq_id order), `app` (routes), `__main__` (the process).
"""
