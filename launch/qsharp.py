r"""Q♯ (Zhou et al. arXiv:2502.20548): fit a return-distribution guide for the reference
policy and decode with it; compare with π_ref and Best-of-N.

  python launch/qsharp.py --config=configs/ppo.py:arith --workdir=runs/arith \
      --config.sampler.prompt_buckets=64,128 --rounds=3 --eta=0.1 --top_k=8 \
      --output=runs/arith/qsharp_guide.npz
  # Best-of-N by a reward model beside it:
  ... --config.reward.route=rm --config.reward.rm.checkpoint=RM --bon_n=4

The reference is the policy of `model.checkpoint` (or <workdir>/sft). Each round rolls
in with the current guided policy (round 0: none), rolls out with π_ref, labels the
responses with the verifier (`reward` correct/wrong scores are the returns) and refits
the guide's head on everything so far. After each round the held-out prompts are
sampled (T = 1, --eval_samples each) by π_ref and by the guided policy: accuracy and
KL(π_guided ‖ π_ref) per response (Σ_t log π_guided − log π_ref of the sampled tokens).
With a model reward (`reward.route` other than verifier) and --bon_n, Best-of-N by
that reward is evaluated too (its KL is at most log N − (N−1)/N; Beirami et al.).
One JSON line per evaluation; the guide is saved with --output (.npz).
"""

from __future__ import annotations

import json

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Preset file (configs/*.py:variant).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (arith: the warm start in sft/).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Data-collection rounds (round 0: π_ref only).")
_PROMPTS = flags.DEFINE_integer("prompts_per_round", 256, "Training prompts per round.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Roll-outs per prompt per round.")
_STEPS = flags.DEFINE_integer("steps", 300, "Head-fitting steps after each round.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per fitting step.")
_LR = flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate of the head.")
_BINS = flags.DEFINE_integer("num_bins", 2, "Return bins (from wrong_score to correct_score).")
_ETA = flags.DEFINE_float("eta", 0.1, "η, the KL coefficient of the guided policy.")
_TOP_K = flags.DEFINE_integer("top_k", 8, "π_ref's candidate tokens reweighted per step.")
_EVAL_SAMPLES = flags.DEFINE_integer("eval_samples", 4, "Samples per held-out prompt.")
_BON_N = flags.DEFINE_list("bon_n", [], "Best-of-N by the reward section's model scorer.")
_OUTPUT = flags.DEFINE_string("output", "", "Where to save the guide (.npz).")
flags.mark_flags_as_required(["config"])


def evaluate(name, sampler, reference, policy, examples, verifier, c, *, samples, seed):
  """Accuracy and mean KL to π_ref of `samples` T=1 samples per held-out prompt."""
  import numpy as np

  from rlhf_jax.algorithms.rollout import build_rollout_batch
  from rlhf_jax.sampling import SamplingParams
  tok = policy.tokenizer
  prompts = [policy.prefix + tok.encode(e.prompt) for e in examples]
  out = sampler.generate(prompts, SamplingParams(
      n=samples, max_new_tokens=c.rollout.max_new_tokens, stop_token_ids=(tok.eos_id,),
      seed=seed))
  flat = [(e, p, s) for e, p, group in zip(examples, prompts, out) for s in group]
  correct = verifier.score([e for e, _, _ in flat],
                           [tok.decode(s.token_ids) for _, _, s in flat]).correct
  batch = build_rollout_batch([p for _, p, _ in flat], [s.token_ids for _, _, s in flat],
                              [s.model_logprobs for _, _, s in flat], [0.0] * len(flat),
                              [False] * len(flat), list(range(len(flat))),
                              prompt_length=c.data.prompt_length,
                              response_length=c.rollout.max_new_tokens, pad_id=tok.pad_id)
  ref = np.asarray(reference(batch))
  kl = np.sum((np.asarray(batch.old_logprobs) - ref) * np.asarray(batch.response_mask), axis=1)
  return {"policy": name, "accuracy": float(np.mean(correct)), "kl_to_ref": float(np.mean(kl)),
          "samples": len(flat),
          "response_length": float(np.mean([len(s.token_ids) for _, _, s in flat]))}


def check_flags(c) -> None:
  """Usage errors before anything loads."""
  if min(_ROUNDS.value, _PROMPTS.value, _SAMPLES.value, _STEPS.value, _TOP_K.value) < 1:
    raise app.UsageError("--rounds, --prompts_per_round, --samples, --steps, --top_k >= 1.")
  if _ETA.value <= 0:
    raise app.UsageError(f"--eta={_ETA.value} must be > 0.")
  if c.rollout.max_new_tokens < 2:
    raise app.UsageError("config.rollout.max_new_tokens must be >= 2 (a roll-in and a roll-out).")
  if c.sampler.address:  # the search steps and cancels samples in the scheduler itself
    raise app.UsageError(f"config.sampler.address={c.sampler.address!r}: this launcher runs "
                         "the in-process scheduler; leave the address empty.")
  longest = c.data.prompt_length + c.rollout.max_new_tokens - 1  # prompt + roll-in
  if max(c.sampler.prompt_buckets) < longest:
    raise app.UsageError(f"config.sampler.prompt_buckets={tuple(c.sampler.prompt_buckets)} "
                         f"must reach {longest} tokens (a roll-out starts from the prompt "
                         f"and the roll-in), e.g. --config.sampler.prompt_buckets="
                         f"{c.data.prompt_length},{longest + 1}")


def best_of_n_rows(c, sampler, policy, held_out, verifier, tasks, mesh):
  """Held-out accuracy of Best-of-N by the reward section's scorer, each --bon_n."""
  import dataclasses
  import math

  import numpy as np

  from rlhf_jax.rollout import config as rollout_config_lib
  from rlhf_jax.rollout.best_of_n import SpeculativeRejection
  from rlhf_jax.training import build
  if not _BON_N.value:
    return []
  scorer = build.build_scorer(c, tasks, mesh)
  sampling = dataclasses.replace(
      rollout_config_lib.sampling_params(c.rollout, (policy.tokenizer.eos_id,)), seed=c.seed)
  prompts = [policy.prefix + policy.tokenizer.encode(e.prompt) for e in held_out]
  rows = []
  try:
    for n in map(int, _BON_N.value):
      result = SpeculativeRejection(sampler, scorer, policy.tokenizer, n_init=n).run(
          held_out, prompts, sampling)
      rows.append({"round": None, "policy": f"best_of_{n}",
                   "accuracy": float(np.mean(verifier.score(held_out, result.texts).correct)),
                   "kl_to_ref_bound": math.log(n) - (n - 1) / n})
  finally:
    getattr(scorer, "close", lambda: None)()
  return rows


def main(argv) -> None:
  del argv
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  import functools

  import jax
  import numpy as np

  from rlhf_jax.algorithms import qsharp
  from rlhf_jax.algorithms.rollout import response_logprobs
  from rlhf_jax.sampling import GuidedParams
  from rlhf_jax.sampling import config as sampler_config_lib
  from rlhf_jax.training import build
  from rlhf_jax.training import qsharp_training
  from rlhf_jax.training.config import validate_config

  c = _CONFIG.value
  validate_config(c, num_devices=jax.device_count())
  check_flags(c)
  mesh = build.trainer_mesh(c)
  policy = build.load_policy(c, _WORKDIR.value, mesh)
  train, held_out = build.load_examples(c)
  tasks = sorted({e.task for e in train + held_out})
  verifier = build.build_verifiers(c, tasks)
  values = qsharp.bin_values(_BINS.value, c.reward.wrong_score, c.reward.correct_score)
  model_params = build.generation_params(c, policy, policy.params, mesh)
  guide = qsharp.init_guide(policy.model.config.hidden_size, policy.model.config.vocab_size,
                            _BINS.value)
  ref_sampler = build.build_sampler(c, policy, mesh)
  guided = sampler_config_lib.build_scheduler(
      c.sampler, policy.model, GuidedParams(model_params, guide), tokenizer=policy.tokenizer,
      seed=c.seed + 1, logits_hook=functools.partial(
          qsharp.guided_logits, values=values, eta=_ETA.value, top_k=_TOP_K.value))
  forward = jax.jit(lambda params, batch: response_logprobs(policy.model, params, batch))
  run_eval = functools.partial(evaluate, reference=lambda b: forward(policy.params, b),
                               policy=policy, examples=held_out, verifier=verifier, c=c,
                               samples=_EVAL_SAMPLES.value, seed=c.seed + 99)
  print(json.dumps({"round": None, **run_eval("reference", ref_sampler)}), flush=True)
  for row in best_of_n_rows(c, ref_sampler, policy, held_out, verifier, tasks, mesh):
    print(json.dumps(row), flush=True)
  data = None
  for round_index in range(_ROUNDS.value):
    examples = train[round_index * _PROMPTS.value:(round_index + 1) * _PROMPTS.value]
    rows, responses, switches = qsharp_training.rollouts(
        ref_sampler, guided if round_index else None,
        [policy.prefix + policy.tokenizer.encode(e.prompt) for e in examples],
        samples=_SAMPLES.value, max_new_tokens=c.rollout.max_new_tokens,
        stop=(policy.tokenizer.eos_id,), seed=c.seed + round_index)
    labelled = verifier.score([e for e in examples for _ in range(_SAMPLES.value)],
                              [policy.tokenizer.decode(r) for r in responses])
    data = qsharp_training.guide_data(
        policy.model, policy.params, rows, responses, switches, labelled.scores,
        prompt_length=c.data.prompt_length, response_length=c.rollout.max_new_tokens,
        pad_id=policy.tokenizer.pad_id).extend(data)
    guide, _ = qsharp_training.fit_guide(
        guide, data, values=values, steps=_STEPS.value, batch_size=_BATCH.value,
        learning_rate=_LR.value, seed=c.seed + round_index,
        log=lambda line: print(line, flush=True))
    guided.update_params(GuidedParams(model_params, guide), version=round_index + 1)
    print(json.dumps({"round": round_index, "rows": int(len(data.returns)),
                      "rollout_accuracy": float(np.mean(labelled.correct)),
                      **run_eval(f"qsharp_eta{_ETA.value}", guided)}), flush=True)
  if _OUTPUT.value:
    np.savez(_OUTPUT.value, **{k: np.asarray(v) for k, v in guide.items()}, values=values,
             eta=_ETA.value, top_k=_TOP_K.value)
  verifier.close()


if __name__ == "__main__":
  from rlhf_jax import cli
  cli.run(main)
