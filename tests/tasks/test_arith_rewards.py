"""The arith task's reward-model data (tasks/arith_rewards.py): preference pairs always reject a
wrong answer, and the judged responses, with and without references, are verified as labelled."""

from __future__ import annotations

from rlhf_jax.rewards import genrm
from rlhf_jax.tasks import arith
from rlhf_jax.rewards import model_training as rt


def test_arith_pairs_always_reject_a_wrong_answer():
  from rlhf_jax.tasks import arith_rewards
  for pair in arith_rewards.preference_pairs(0, 30):
    answer = pair.metadata["answer"]
    assert arith.verify(pair.chosen, answer) and not arith.verify(pair.rejected, answer)
  judged = arith_rewards.judged_responses(0, 60)
  assert all(arith.verify(r, e.answer) == ok for e, r, ok in judged)
  assert 0 < sum(ok for *_, ok in judged) < 60
  with_references = arith_rewards.judged_with_references(0, 60)
  assert [(e.prompt, r, ok) for e, r, ok in with_references] == [
      (e.prompt, r, ok) for e, r, ok in judged]
  references = [e.metadata["reference"] for e, _, _ in with_references]
  assert 0 < sum(arith.verify(ref, e.answer) for ref, (e, _, _) in
                 zip(references, with_references)) < 60
  questions = rt.genrm_sft_pairs(with_references, template=genrm.REFERENCE_TEMPLATE, yes="Y",
                                 no="N")
  assert all(ref in q for ref, (q, _) in zip(references, questions))
