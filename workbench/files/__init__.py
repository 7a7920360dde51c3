"""The experiment directory's files: the contracts between the processes.

`layout` says where each file lives; the other modules own one format each (metrics,
rollouts, run control, samples, the busy file, the experiment's changes, the inference
endpoint), written atomically by one process and read by the others."""
