"""What the test suite and the benchmarks start instead of real children: not for users.

`standins` (a plan of small Python processes, `standin_child`) runs the real supervisor
daemon without vLLM, torchrun or orchestrators; `local_server` starts one real vLLM
server for an experiment directory without a supervisor."""
