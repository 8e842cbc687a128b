"""Training checkpoints (Orbax): everything a run needs to continue exactly.

One checkpoint per saved step under <workdir>/checkpoints/<step>/ with two items:
  state   the array pytree: actor and critic params + optimizer states, the
          reference params (EMA or fixed);
  meta    JSON: step, the trainer's NumPy RNG state, the data position, the
          dynamic-sampling buffer, the config, and the sampler's weight version.
Saving is atomic (Orbax writes to a temporary directory and renames), so a run
killed mid-save resumes from the previous checkpoint.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores trainer checkpoints in `<workdir>/checkpoints`.

  Args:
    workdir: the run directory.
    max_to_keep: most checkpoints kept (older ones are deleted).
  """

  def __init__(self, workdir: str, max_to_keep: int = 3):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                                             create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Writes checkpoint `step` and waits until it is on disk."""
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)),
                      force=True)
    self.manager.wait_until_finished()

  def restore(self, step: int, state_template: Any) -> tuple[Any, dict[str, Any]]:
    """(state, meta) of checkpoint `step`; arrays take the template's shapes,
    dtypes and shardings."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_template)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def close(self) -> None:
    """Finishes pending writes."""
    self.manager.wait_until_finished()
    self.manager.close()
