"""rlhf_jax.sandbox: running untrusted programs contained, and killable worker pools.

jobs.py runs one candidate program (or the trusted harness that tests it) in a sandboxed
child process: bubblewrap namespaces (launch.py), a seccomp filter (seccomp_filter.py), a
cgroup per job (job_cgroup.py), a uid per job (uids.py); runner.py and harness.py are the
two programs it starts and wire.py the plain data between them. workers.py is a pool of
worker processes whose calls have a deadline; reward_values.py checks a reward that user
code returned through them (finite in float32). The code verifier (rewards/code.py), the
environments' tools (envs/tools.py) and the reward functions' scorer use this room; it uses
no other room but data.
"""
