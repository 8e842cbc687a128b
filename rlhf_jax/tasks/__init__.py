"""rlhf_jax.tasks: built-in tasks (problem generators with rule-based verifiers) and the
task table (`registry`): `register_task(Task(...))` adds one of your own."""

from rlhf_jax.tasks.registry import Task
from rlhf_jax.tasks.registry import get_task
from rlhf_jax.tasks.registry import known_tasks
from rlhf_jax.tasks.registry import register_task

__all__ = ["Task", "get_task", "known_tasks", "register_task"]
