"""rlhf_jax.sandbox: running untrusted programs contained, and killable worker pools.

jobs.py runs one candidate program (or the trusted harness that tests it) in a sandboxed
child process: bubblewrap namespaces (launch.py), a seccomp filter (seccomp_filter.py), a
cgroup per job (job_cgroup.py), a uid per job (uids.py); runner.py and harness.py are the
two programs it starts and wire.py the plain data between them. workers.py is a pool of
worker processes whose calls have a deadline. The code verifier (rewards/code.py) and the
environments' tools (envs/tools.py) both use this room; it uses no other room but data.
"""
