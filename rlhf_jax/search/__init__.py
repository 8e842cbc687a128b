"""rlhf_jax.search: inference-time methods run end to end on a run's held-out prompts —
Best-of-N and speculative rejection (best_of_n.py), Q♯-guided decoding (qsharp.py).

Each is one function that `launch/` calls: it builds the run's parts from the config
(training/build.py), runs the method and yields one JSON-able row per result. The
algorithms themselves live below (search/speculative_rejection.py; algorithms/qsharp.py and
algorithms/qsharp_fit.py).
"""
