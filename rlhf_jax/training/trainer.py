"""The RL loop: prompts → sampler → rewards → reference / critic → advantages → updates.

One loop serves every preset; what differs is configuration (configs/*.py →
`rlhf_jax.algorithms.ppo_family`). Each trained model has one jitted update
step built once per run (fixed shapes: P prompt tokens, R response tokens,
fixed mini-batch rows), so nothing recompiles after the first step.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import time
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhf_jax import kernels
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.data import Example
from rlhf_jax.data import PromptStream
from rlhf_jax.data import read_jsonl
from rlhf_jax.rewards import RewardRouter
from rlhf_jax.sampling import FireSchedule
from rlhf_jax.sampling import SamplingParams
from rlhf_jax.sampling import config as sampler_config_lib
from rlhf_jax.tasks import arith
from rlhf_jax.algorithms import rollout as rollout_lib
from rlhf_jax.algorithms import windowed
from rlhf_jax.training import sft as sft_lib
from rlhf_jax.training.checkpoint import Checkpointer
from rlhf_jax.training.config import validate_config
from rlhf_jax.training.evaluation import evaluate_policy


@flax.struct.dataclass
class TrainState:
  """A trained model's parameters and optimizer state."""
  params: Any
  opt_state: Any


def make_optimizer(learning_rate: float, warmup_steps: int, weight_decay: float,
                   max_grad_norm: float) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW with linear warmup to a constant rate (DAPO §4.1).

  Update k (from 0) uses lr·min(1, (k+1)/warmup_steps): the first update already moves.
  """
  warmup = max(warmup_steps, 1)

  def schedule(count):
    return learning_rate * jnp.minimum(1.0, (count + 1) / warmup)

  return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                     optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8,
                                 weight_decay=weight_decay))


def new_train_state(optimizer: optax.GradientTransformation, params, mesh) -> TrainState:
  """Params with a fresh optimizer state on `mesh`: moments take the params' layout,
  scalars (step counts) are replicated."""
  opt_state = optimizer.init(params)
  mesh_devices = set(mesh.devices.flat)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  opt_state = jax.tree.map(
      lambda x: x if x.sharding.device_set == mesh_devices else jax.device_put(x, replicated),
      opt_state)
  return TrainState(params=params, opt_state=opt_state)


def _keep_if_finite(finite, new, old):
  """`new` where the update is finite, else `old` (a skipped update)."""
  return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def _build_update(loss_fn, algorithm, optimizer, prefix: str):
  """jit(update(state, minibatch, targets) → (state, metrics)) around
  `loss_fn(params, minibatch, targets, normalizer) → (loss, metrics)`.

  The normaliser is the whole mini-batch's aggregation count. A non-finite loss
  or gradient norm leaves the state unchanged; `{prefix}skipped` is then 1. The
  new state keeps the layout of the first state passed in (left to itself, XLA
  may hand back, say, a norm scale split over fsdp).
  """

  def update(state, batch, targets):
    normalizer = kernels.aggregation_normalizer(batch.response_mask, mode=algorithm.agg)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, targets, normalizer)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(params=_keep_if_finite(finite, params, state.params),
                           opt_state=_keep_if_finite(finite, opt_state, state.opt_state))
    return new_state, dict(metrics, **{f"{prefix}loss": loss, f"{prefix}grad_norm": grad_norm,
                                       f"{prefix}skipped": (~finite).astype(jnp.float32)})

  compiled = {}

  def call(state, batch, targets):
    if "update" not in compiled:
      layout = jax.tree.map(lambda x: x.sharding, state)
      compiled["update"] = jax.jit(update, out_shardings=(layout, None))
    return compiled["update"](state, batch, targets)

  return call


def build_actor_update(model, algorithm, optimizer):
  """The jitted actor step: (state, minibatch, advantages [b, R]) → (state, metrics).

  Loss: `ppo_family.actor_loss`; metrics add the gap |log π − log π_old| (max, mean)
  between this forward and the sampler's log-probs.
  """

  def loss_fn(params, batch, advantages, normalizer):
    logprobs, entropy = rollout_lib.response_logprobs(model, params, batch, with_entropy=True)
    loss, metrics = ppo_family.actor_loss(algorithm, logprobs, entropy, batch, advantages,
                                          normalizer)
    mask = batch.response_mask
    gap = jnp.abs(jax.lax.stop_gradient(logprobs) - batch.old_logprobs) * mask
    metrics["logprob_mismatch_max"] = jnp.max(gap)
    metrics["logprob_mismatch_mean"] = kernels.masked_mean(gap, mask)
    return loss, metrics

  return _build_update(loss_fn, algorithm, optimizer, prefix="")


def build_critic_update(critic, algorithm, optimizer):
  """The jitted critic step: (state, minibatch, returns [b, R]) → (state, metrics);
  loss `ppo_family.critic_loss` (clipped value loss)."""

  def loss_fn(params, batch, returns, normalizer):
    values = rollout_lib.response_values(critic, params, batch)
    return ppo_family.critic_loss(algorithm, values, batch, returns, normalizer)

  return _build_update(loss_fn, algorithm, optimizer, prefix="critic_")


@dataclasses.dataclass
class Group:
  """The G scored samples of one prompt."""
  example: Example
  prompt_ids: list[int]
  responses: list[list[int]]
  logprobs: list[list[float]]
  scores: list[float]
  correct: list[bool]
  truncated: list[bool]
  failures: list[str]


class NoSignalError(RuntimeError):
  """Dynamic sampling found no group with varying correctness for too many rounds."""


def arith_tokenizer():
  """The character tokenizer of the built-in task."""
  return models.build_character_tokenizer(arith.ALPHABET)


def arith_model_config(c, vocab_size: int) -> models.DecoderConfig:
  """The tiny decoder of the arith variant."""
  width, heads = c.model.hidden_size, c.model.num_heads
  return models.DecoderConfig(
      vocab_size=vocab_size, hidden_size=width, num_layers=c.model.num_layers, num_heads=heads,
      num_kv_heads=max(1, heads // 2), head_dim=width // heads, intermediate_size=3 * width,
      max_position_embeddings=c.sampler.cache_length)


PROMPT_FORMAT_FILE = "prompt_format.json"
ARITH_PROMPT_PREFIX = ("<|im_start|>",)  # the token the arith task puts before every prompt


def prompt_prefix(tokenizer) -> list[int]:
  """Token ids the arith task puts before every prompt (`ARITH_PROMPT_PREFIX`)."""
  return [tokenizer.backend.token_to_id(token) for token in ARITH_PROMPT_PREFIX]


def save_policy(directory: str, model, params, tokenizer, prefix_tokens: list[str]) -> None:
  """An HF checkpoint directory + tokenizer + prompt format (what eval.py and train.py load)."""
  models.save_hf_checkpoint(directory, model, params)
  tokenizer.save(directory)
  with open(os.path.join(directory, PROMPT_FORMAT_FILE), "w", encoding="utf-8") as f:
    json.dump({"prefix_tokens": prefix_tokens}, f)


def load_prompt_prefix(directory: str, tokenizer) -> list[int]:
  """Token ids to put before each prompt, from the checkpoint's prompt_format.json ([] if none)."""
  path = os.path.join(directory, PROMPT_FORMAT_FILE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    tokens = json.load(f)["prefix_tokens"]
  ids = [tokenizer.backend.token_to_id(t) for t in tokens]
  if None in ids:
    raise ValueError(f"{path}: prefix tokens {tokens} are not all in the tokenizer.")
  return ids


def ensure_sft_checkpoint(c, workdir: str, log: Callable[[str], None] = print) -> str:
  """The arith warm start: trains and saves `<workdir>/sft` unless it exists."""
  directory = c.model.checkpoint or os.path.join(workdir, "sft")
  if os.path.exists(os.path.join(directory, "config.json")):
    log(f"SFT warm start: {directory} (delete it to train a new one)")
    return directory
  log(f"no SFT checkpoint in {directory}: training the arith warm start from scratch "
      f"({c.sft.steps} steps)")
  tokenizer = arith_tokenizer()
  model, params = models.init_model(arith_model_config(c, tokenizer.vocab_size), seed=c.seed)
  make_batch = sft_lib.sft_arith_batches(
      tokenizer, seed=c.seed + 17, batch_size=c.sft.batch_size, levels=tuple(c.sft.levels),
      weights=tuple(c.sft.level_weights), prompt_prefix=prompt_prefix(tokenizer),
      prompt_length=c.data.prompt_length, response_length=c.rollout.max_new_tokens,
      direct_fraction=c.sft.direct_fraction)
  start = time.perf_counter()

  def progress(step, loss):
    if (step + 1) % 50 == 0 or step == 0 or step == c.sft.steps - 1:
      log(f"{progress_bar(step + 1, c.sft.steps)} SFT warm start step {step + 1}/{c.sft.steps} "
          f"| loss {loss:.4f} | {time.perf_counter() - start:.0f}s")

  result = sft_lib.run_sft(model, params, make_batch, steps=c.sft.steps,
                           learning_rate=c.sft.learning_rate, progress=progress)
  # Written aside and renamed, so an interrupted save never looks like a checkpoint.
  partial = directory.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  save_policy(partial, model, result.params, tokenizer, list(ARITH_PROMPT_PREFIX))
  if os.path.exists(directory):  # a leftover without config.json
    shutil.rmtree(directory)
  os.replace(partial, directory)
  log(f"SFT warm start saved to {directory}")
  return directory


def load_examples(c) -> tuple[list[Example], list[Example]]:
  """Training and held-out examples (JSONL files, or generated arith problems)."""
  def generated(seed, count):
    return [Example(**{k: v for k, v in p.to_json().items()})
            for p in arith.generate(seed, count, tuple(c.data.levels),
                                    tuple(c.data.level_weights))]
  train = read_jsonl(c.data.train_file) if c.data.train_file else generated(c.seed + 1,
                                                                              c.data.num_train)
  held_out = read_jsonl(c.data.eval_file) if c.data.eval_file else (
      generated(c.seed + 2, c.data.num_eval) if c.variant == "arith" else [])
  return train, held_out


class Trainer:
  """Runs one RL training job.

  Args:
    config: a validated trainer config (rlhf_jax.training.config).
    workdir: where checkpoints, metrics.jsonl and the SFT start live.
    log: where progress lines go.
    verifiers: task name → verifier, replacing the built-in ones (tests, custom tasks).
  """

  def __init__(self, config, workdir: str, log: Callable[[str], None] = print,
               verifiers=None):
    validate_config(config, num_devices=jax.device_count())
    self.config = c = config
    self.workdir = workdir
    self.log = log
    os.makedirs(workdir, exist_ok=True)
    self.algorithm = a = c.algorithm
    checkpoint = (ensure_sft_checkpoint(c, workdir, log) if c.variant == "arith"
                  else c.model.checkpoint)
    self.model, params = models.load_hf_checkpoint(checkpoint)
    # Every model lives on one mesh (a single device by default): the trained
    # trees in TRAIN_RULES layout (FSDP + tensor), the sampler's copy in GENERATE_RULES.
    self.mesh = trainer_mesh(c)
    params = parallel.shard_params(params, parallel.param_shardings(
        params, self.model.logical_axes(), self.mesh))
    self.tokenizer = models.Tokenizer.from_directory(checkpoint)
    self.prefix = load_prompt_prefix(checkpoint, self.tokenizer)
    self.prefix_tokens = [self.tokenizer.backend.id_to_token(i) for i in self.prefix]
    self.train_examples, self.held_out = load_examples(c)
    self.router = RewardRouter(verifiers, correct_score=c.reward.correct_score,
                               wrong_score=c.reward.wrong_score,
                               failure_score=c.reward.failure_score,
                               timeout_s=c.reward.timeout_s)
    self.router.check_tasks([e.task for e in self.train_examples + self.held_out])
    self.stream = PromptStream(self.train_examples, seed=c.seed, shuffle=c.data.shuffle)
    if c.sampler.address:
      from rlhf_jax.sampling.client import SamplerClient
      self.sampler = SamplerClient(c.sampler.address)
      self.sampler.wait_ready()
      # The server serves exactly this policy from the first rollout on.
      self.sampler.update_params(params, version=0)
    else:
      self.sampler = sampler_config_lib.build_scheduler(
          c.sampler, self.model, self.generation_params(params), tokenizer=self.tokenizer,
          seed=c.seed)
    self.actor_optimizer = make_optimizer(c.optimizer.learning_rate, c.optimizer.warmup_steps,
                                          c.optimizer.weight_decay, c.optimizer.max_grad_norm)
    self.actor = new_train_state(self.actor_optimizer, params, self.mesh)
    self.actor_update = build_actor_update(self.model, a, self.actor_optimizer)
    self.reference = params if ppo_family.uses_reference(a) else None
    self.logprob_fn = jax.jit(lambda p, b: rollout_lib.response_logprobs(self.model, p, b))
    self.critic = None
    if ppo_family.uses_critic(a):
      self.critic_model, critic_params = models.critic_from_policy(self.model, params)
      critic_params = parallel.shard_params(critic_params, parallel.param_shardings(
          critic_params, self.critic_model.logical_axes(), self.mesh))
      self.critic_optimizer = make_optimizer(c.optimizer.critic_learning_rate,
                                             c.optimizer.warmup_steps, 0.0,
                                             c.optimizer.max_grad_norm)
      self.critic = new_train_state(self.critic_optimizer, critic_params, self.mesh)
      self.critic_update = build_critic_update(self.critic_model, a, self.critic_optimizer)
      self.value_fn = jax.jit(lambda p, b: rollout_lib.response_values(self.critic_model, p, b))
    self.buffer: collections.deque[Group] = collections.deque()
    self.windows = None
    if a.window_tokens:
      self.windows = windowed.WindowPool(
          c.rollout.prompts_per_step * a.group_size, group_size=a.group_size,
          window_tokens=a.window_tokens, max_new_tokens=c.rollout.max_new_tokens,
          stop_token_ids=self.stop_token_ids())
    self.step = 0
    self.kl_reward_coef = float(a.kl_reward_coef)  # β; the adaptive controller moves it
    self.rng = np.random.default_rng(c.seed)
    self.metrics_path = os.path.join(workdir, "metrics.jsonl")
    self._tensorboard = None
    self.checkpointer = Checkpointer(workdir)
    if self.checkpointer.latest_step() is not None:
      self.restore(self.checkpointer.latest_step())

  # ------------------------------------------------------------------ mesh

  def generation_params(self, params):
    """The policy in the sampler's layout (GENERATE_RULES: replicated over data and
    fsdp, split over tensor); what a server gets is gathered to the host anyway."""
    if self.config.sampler.address:
      return params
    return parallel.reshard(params, parallel.param_shardings(
        params, self.model.logical_axes(), self.mesh, parallel.GENERATE_RULES))

  def on_mesh(self, host_batch: rollout_lib.RolloutBatch) -> rollout_lib.RolloutBatch:
    """The rollout batch on the mesh, rows split over (data, fsdp) (validate_config
    checks that they divide)."""
    return jax.tree.map(
        lambda x: jax.device_put(x, parallel.batch_sharding(self.mesh, np.ndim(x))), host_batch)

  # ------------------------------------------------------------------ checkpoints

  def _state_tree(self) -> dict[str, Any]:
    return {"actor": self.actor, "critic": self.critic if self.critic is not None else {},
            "reference": self.reference if self.reference is not None else {}}

  def save(self) -> None:
    """Checkpoints everything needed to continue exactly (see training/checkpoint.py)."""
    meta = {"step": self.step, "rng": self.rng.bit_generator.state,
            "kl_reward_coef": self.kl_reward_coef,
            "stream": self.stream.state(),
            "buffer": [dataclasses.asdict(g) for g in self.buffer],
            "windows": self.windows.state() if self.windows is not None else None,
            "config": self.config.to_dict()}
    self.checkpointer.save(self.step, self._state_tree(), json.loads(json.dumps(meta)))

  def restore(self, step: int) -> None:
    """Continues from checkpoint `step` (and drops metrics logged after it)."""
    state, meta = self.checkpointer.restore(step, self._state_tree())
    self.actor = state["actor"]
    if self.critic is not None:
      self.critic = state["critic"]
    if self.reference is not None:
      self.reference = state["reference"]
    self.step = int(meta["step"])
    self.kl_reward_coef = float(meta["kl_reward_coef"])
    self.rng.bit_generator.state = meta["rng"]
    self.stream.restore(meta["stream"])
    self.buffer = collections.deque(
        Group(**{**g, "example": Example(**g["example"])}) for g in meta["buffer"])
    if self.windows is not None:
      self.windows.restore(meta["windows"])
    changed = sorted(k for k, v in _flatten(meta["config"]).items()
                     if _flatten(self.config.to_dict()).get(k) != v)
    if changed:
      self.log(f"resuming with changed config fields: {', '.join(changed)}")
    self.sampler.update_params(self.generation_params(self.actor.params), version=self.step)
    if os.path.exists(self.metrics_path):
      with open(self.metrics_path, encoding="utf-8") as f:
        kept = [line for line in f if json.loads(line)["step"] <= self.step]
      with open(self.metrics_path, "w", encoding="utf-8") as f:
        f.writelines(kept)
    self.log(f"resumed from step {self.step}")

  # ------------------------------------------------------------------ sampling

  def sampling_params(self) -> SamplingParams:
    """The training SamplingParams (group_size samples per prompt, a fresh seed per call)."""
    c = self.config
    fire = (FireSchedule(temperature=c.rollout.fire_temperature, top_k=c.rollout.fire_top_k)
            if c.rollout.fire else None)
    return SamplingParams(temperature=c.rollout.temperature, top_p=c.rollout.top_p,
                          top_k=c.rollout.top_k, max_new_tokens=c.rollout.max_new_tokens,
                          stop_token_ids=self.stop_token_ids(), n=self.algorithm.group_size,
                          seed=int(self.rng.integers(2**31)), fire=fire)

  def stop_token_ids(self) -> tuple[int, ...]:
    """Tokens that end a response: EOS, or none when `rollout.stop_at_eos` is off."""
    return (self.tokenizer.eos_id,) if self.config.rollout.stop_at_eos else ()

  def encode_prompt(self, example: Example) -> list[int]:
    """Prompt token ids (prefix + text); a prompt longer than data.prompt_length is an error."""
    ids = self.prefix + self.tokenizer.encode(example.prompt)
    if len(ids) > self.config.data.prompt_length:
      raise ValueError(f"a prompt has {len(ids)} tokens, more than data.prompt_length="
                       f"{self.config.data.prompt_length}: {example.prompt[:60]!r}...")
    return ids

  def generate_groups(self, examples: list[Example]) -> list[Group]:
    """Samples G responses per example and scores them."""
    prompts = [self.encode_prompt(e) for e in examples]
    out = self.sampler.generate(prompts, self.sampling_params())
    groups = []
    texts, answers, tasks = [], [], []
    for example, samples in zip(examples, out):
      for sample in samples:
        texts.append(self.tokenizer.decode(sample.token_ids))
        answers.append(example.answer)
        tasks.append(example.task)
    scored = self.router.score(texts, answers, tasks)
    index = 0
    for example, prompt, samples in zip(examples, prompts, out):
      n = len(samples)
      sl = slice(index, index + n)
      groups.append(Group(example=example, prompt_ids=prompt,
                          responses=[s.token_ids for s in samples],
                          logprobs=[s.model_logprobs for s in samples],
                          scores=scored.scores[sl], correct=scored.correct[sl],
                          truncated=[s.finish_reason == "length" for s in samples],
                          failures=scored.failures[sl]))
      index += n
    return groups

  def collect_groups(self) -> tuple[list[Group], dict[str, float]]:
    """`prompts_per_step` groups; with dynamic sampling only groups whose correctness
    varies, over-sampling as needed and keeping the surplus for the next step."""
    c, a = self.config, self.algorithm
    wanted = c.rollout.prompts_per_step
    if not a.dynamic_sampling:
      return self.generate_groups(self.stream.take(wanted)), {}
    kept: list[Group] = []
    while self.buffer and len(kept) < wanted:
      kept.append(self.buffer.popleft())
    generated = qualified = rounds = fruitless = 0
    correct = samples = 0
    while len(kept) < wanted:
      groups = self.generate_groups(self.stream.take(wanted * a.oversample))
      rounds += 1
      generated += len(groups)
      correct += sum(sum(g.correct) for g in groups)
      samples += sum(len(g.correct) for g in groups)
      good = [g for g in groups if 0 < sum(g.correct) < len(g.correct)]
      qualified += len(good)
      fruitless = 0 if good else fruitless + 1
      if fruitless >= a.max_generation_rounds:
        raise NoSignalError(
            f"dynamic sampling: {fruitless} generation rounds in a row gave no group whose "
            f"correctness varies (algorithm.max_generation_rounds={a.max_generation_rounds}); "
            "the data is too easy or too hard for the policy.")
      kept.extend(good)
    self.buffer.extend(kept[wanted:])
    metrics = {"generation_rounds": float(rounds), "buffered_groups": float(len(self.buffer))}
    if generated:  # a step served from the buffer alone generated nothing
      metrics.update(accuracy_all_generated=correct / samples,
                     kept_groups_ratio=qualified / generated)
    return kept[:wanted], metrics

  # ------------------------------------------------------------------ one step

  def build_batch(self, groups: list[Group]) -> rollout_lib.RolloutBatch:
    """The RolloutBatch of the step's groups, scores shaped (overlong) and filtered."""
    rows = [(g.prompt_ids, response, lps, score, trunc, gid)
            for gid, g in enumerate(groups)
            for response, lps, score, trunc in zip(g.responses, g.logprobs, g.scores,
                                                   g.truncated)]
    return self._pack(rows)

  def build_window_batch(self, segments: list[windowed.Segment],
                         scores: dict[int, float]) -> rollout_lib.RolloutBatch:
    """T-PPO: the RolloutBatch of the step's windows (one row per in-flight response,
    `scores[i]` for the finished segment i, 0 for unfinished ones)."""
    rows = [(s.trajectory.prompt_ids, s.trajectory.tokens, s.trajectory.logprobs,
             scores.get(i, 0.0), s.truncated, s.trajectory.group)
            for i, s in enumerate(segments)]
    return self._pack(rows, window_starts=[s.window_start for s in segments],
                      finished=[s.finished for s in segments])

  def _pack(self, rows, window_starts=None, finished=None) -> rollout_lib.RolloutBatch:
    """Rows (prompt, response, log-probs, score, truncated, group) → RolloutBatch, with
    DAPO's overlong punishment (finished rows) and filter."""
    c, a = self.config, self.algorithm
    prompts, responses, logprobs, scores, truncated, group_ids = (list(x) for x in zip(*rows))
    batch = rollout_lib.build_rollout_batch(
        prompts, responses, logprobs, scores, truncated, group_ids,
        prompt_length=c.data.prompt_length, response_length=c.rollout.max_new_tokens,
        pad_id=self.tokenizer.pad_id, window_starts=window_starts, finished=finished)
    if a.overlong_buffer:
      penalty = np.asarray(kernels.overlong_penalty(
          batch.lengths, max_length=c.rollout.max_new_tokens, buffer_length=a.overlong_buffer,
          factor=a.overlong_factor))
      batch = batch.replace(scores=batch.scores + penalty * batch.finished)
    if a.overlong_filter:
      batch = batch.replace(response_mask=batch.response_mask * ~batch.truncated[:, None])
    return batch

  def collect_windows(self) -> tuple[rollout_lib.RolloutBatch, dict[str, Any]]:
    """T-PPO: tops the in-flight pool up, generates one window for each response,
    scores those that finished; returns the batch and what the metrics need."""
    pool = self.windows
    started = pool.fill(lambda n: [(e, self.encode_prompt(e)) for e in self.stream.take(n)])
    seeds = self.rng.integers(2**31, size=len(pool.in_flight))
    requests = pool.requests(self.sampling_params(), seeds=[int(x) for x in seeds])
    out = self.sampler.generate([prompt for prompt, _ in requests],
                                [sampling for _, sampling in requests])
    segments = pool.advance([(o[0].token_ids, o[0].model_logprobs) for o in out])
    done = [i for i, seg in enumerate(segments) if seg.finished]
    scored = self.router.score(
        [self.tokenizer.decode(segments[i].trajectory.tokens) for i in done],
        [segments[i].trajectory.example.answer for i in done],
        [segments[i].trajectory.example.task for i in done])
    batch = self.build_window_batch(segments, dict(zip(done, scored.scores)))
    info = {"correct": list(scored.correct), "failures": [f for f in scored.failures if f],
            "metrics": {"finished_responses": float(len(done)),
                        "started_responses": float(started),
                        "in_flight_responses": float(len(pool.in_flight))}}
    return batch, info

  def train_step(self) -> dict[str, float]:
    """One rollout batch → updates; returns the step's metrics."""
    c, a = self.config, self.algorithm
    times = {}
    start = time.perf_counter()
    if self.windows is not None:
      host_batch, info = self.collect_windows()
      sampling_metrics = info["metrics"]
      correct, failures = info["correct"], info["failures"]
    else:
      groups, sampling_metrics = self.collect_groups()
      host_batch = self.build_batch(groups)
      correct = [x for g in groups for x in g.correct]
      failures = [x for g in groups for x in g.failures if x]
    finished_rows = np.asarray(host_batch.finished)
    times["time_generate"] = time.perf_counter() - start
    start = time.perf_counter()
    batch = self.on_mesh(host_batch)
    times["time_reward"] = time.perf_counter() - start
    start = time.perf_counter()
    if self.reference is not None:
      batch = batch.replace(ref_logprobs=self.logprob_fn(self.reference, batch))
    if self.critic is not None:
      batch = batch.replace(values=self.value_fn(self.critic.params, batch))
    advantages, returns = ppo_family.advantages_and_returns(a, batch, self.kl_reward_coef)
    kl_metrics = {}
    if a.kl_reward_coef > 0:
      observed = float(ppo_family.rollout_kl(a, batch))
      kl_metrics = {"kl_reward_coef": self.kl_reward_coef, "rollout_kl": observed}
      if a.kl_target > 0:
        self.kl_reward_coef = float(kernels.adaptive_kl_coefficient(
            self.kl_reward_coef, observed, target=a.kl_target, horizon=a.kl_horizon,
            n_steps=int(batch.tokens.shape[0])))
    jax.block_until_ready(advantages)
    times["time_reference_critic"] = time.perf_counter() - start
    start = time.perf_counter()
    rows = batch.tokens.shape[0]
    per_minibatch = rows // c.train.minibatches
    update_actor = self.step >= a.value_pretrain_steps
    updates = collections.defaultdict(list)
    first_mismatch = None
    # The policy learns from the tokens sampled in this step, the critic from finished
    # responses (both are all tokens unless T-PPO windows are on).
    actor_batch = batch.replace(response_mask=batch.policy_mask())
    critic_batch = batch.replace(response_mask=batch.value_mask())
    for _ in range(c.train.ppo_epochs):
      order = self.rng.permutation(rows)
      for m in range(c.train.minibatches):
        chosen = order[m * per_minibatch:(m + 1) * per_minibatch]
        index = jnp.asarray(chosen)
        if update_actor:
          mini = jax.tree.map(lambda x: x[index], actor_batch)
          self.actor, metrics = self.actor_update(self.actor, mini, advantages[index])
          if first_mismatch is None:
            first_mismatch = (metrics["logprob_mismatch_max"], metrics["logprob_mismatch_mean"])
          for key, value in metrics.items():
            updates[key].append(value)
        # A mini-batch without a finished response has no value target.
        if self.critic is not None and finished_rows[chosen].any():
          mini = jax.tree.map(lambda x: x[index], critic_batch)
          self.critic, metrics = self.critic_update(self.critic, mini, returns[index])
          for key, value in metrics.items():
            updates[key].append(value)
    jax.block_until_ready(self.actor.params)
    times["time_update"] = time.perf_counter() - start
    if self.reference is not None and a.ref_ema > 0:
      self.reference = jax.tree.map(lambda r, p: (1 - a.ref_ema) * r + a.ref_ema * p,
                                    self.reference, self.actor.params)
    self.step += 1
    self.sampler.update_params(self.generation_params(self.actor.params), version=self.step)
    metrics = {key: float(np.mean(jax.device_get(values))) for key, values in updates.items()}
    for key in ("logprob_mismatch_max", "logprob_mismatch_mean"):
      metrics.pop(key, None)
    if first_mismatch is not None:
      metrics["logprob_mismatch_max"] = float(first_mismatch[0])
      metrics["logprob_mismatch_mean"] = float(first_mismatch[1])
    # Scores, lengths and accuracy describe finished responses: all rows except T-PPO's
    # unfinished ones (a T-PPO step where none finished has none of these keys).
    scores = np.asarray(host_batch.scores)[finished_rows]
    lengths = np.asarray(host_batch.lengths)[finished_rows]
    if lengths.size:
      metrics.update(
          reward_mean=float(scores.mean()), reward_std=float(scores.std()),
          accuracy=float(np.mean(correct)), response_length_mean=float(lengths.mean()),
          response_length_max=float(lengths.max()),
          truncation_rate=float(np.asarray(host_batch.truncated)[finished_rows].mean()))
    generated_tokens = int(np.sum(np.asarray(host_batch.lengths)
                                  - np.asarray(host_batch.window_starts)))
    metrics.update(
        step=self.step,
        reward_failures=float(len(failures)),
        tokens_per_second=generated_tokens / max(times["time_generate"], 1e-9),
        actor_updated=float(update_actor), **kl_metrics, **sampling_metrics, **times)
    return metrics

  # ------------------------------------------------------------------ evaluation, loop

  def evaluate(self) -> dict[str, float]:
    """Greedy accuracy on the held-out examples with the current weights."""
    if not self.held_out:
      return {}
    result = evaluate_policy(self.sampler, self.tokenizer, self.held_out, self.router,
                             prefix=self.prefix, samples=1, temperature=0.0,
                             max_new_tokens=self.config.rollout.max_new_tokens)
    return {"eval_accuracy": result["accuracy"],
            "eval_response_length": result["response_length"]}

  def write_metrics(self, record: dict[str, Any]) -> None:
    """Appends one JSON line to <workdir>/metrics.jsonl and, with `train.tensorboard`,
    the numbers as TensorBoard scalars under <workdir>/tensorboard."""
    with open(self.metrics_path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
    if self.config.train.tensorboard:
      if self._tensorboard is None:
        from tensorboardX import SummaryWriter
        self._tensorboard = SummaryWriter(os.path.join(self.workdir, "tensorboard"))
      for key, value in record.items():
        if key != "step" and isinstance(value, (int, float)):
          self._tensorboard.add_scalar(key, value, global_step=record["step"])
      self._tensorboard.flush()

  def run(self) -> dict[str, Any]:
    """Trains until `train.steps` with evaluation and checkpoints; returns the summary.

    Ctrl-C (KeyboardInterrupt) saves a checkpoint before it propagates.
    """
    c = self.config
    start = time.perf_counter()
    summary: dict[str, Any] = {}
    if self.held_out and self.step == 0:
      first = self.evaluate()
      summary["eval_accuracy_start"] = first["eval_accuracy"]
      self.write_metrics({"step": self.step, **first})
      self.log(f"step {self.step}: held-out accuracy {first['eval_accuracy']:.3f}")
    try:
      while self.step < c.train.steps:
        metrics = self.train_step()
        if self.held_out and (self.step % c.train.eval_every == 0
                              or self.step == c.train.steps):
          metrics.update(self.evaluate())
          summary["eval_accuracy_end"] = metrics["eval_accuracy"]
        metrics["elapsed_s"] = time.perf_counter() - start
        self.write_metrics(metrics)
        if self.step % c.train.log_every == 0 or "eval_accuracy" in metrics:
          self.log(progress_line(metrics, c.train.steps))
        if self.step % c.train.checkpoint_every == 0 or self.step == c.train.steps:
          self.save()
    except KeyboardInterrupt:
      self.log(f"interrupted: saving a checkpoint at step {self.step}")
      self.save()
      raise
    finally:
      self.checkpointer.close()
      if self._tensorboard is not None:
        self._tensorboard.close()
        self._tensorboard = None
    policy = os.path.join(self.workdir, "policy")
    save_policy(policy, self.model, self.actor.params, self.tokenizer, self.prefix_tokens)
    summary.update(steps=self.step, seconds=time.perf_counter() - start, policy=policy)
    return summary


def trainer_mesh(c) -> jax.sharding.Mesh:
  """The (data, fsdp, tensor) mesh of `config.mesh` over the first devices it needs
  (−1 takes the rest); the default 1×1×1 is one device."""
  sizes = {"data": c.mesh.data, "fsdp": c.mesh.fsdp, "tensor": c.mesh.tensor}
  if -1 in sizes.values():
    sizes = parallel.resolve_axis_sizes(sizes, jax.device_count())
  count = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
  return parallel.make_mesh(**sizes, devices=jax.devices()[:count])


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
  return out


def progress_bar(done: int, total: int, width: int = 20) -> str:
  """`[#####...............]` for done/total."""
  filled = int(width * done / max(total, 1))
  return f"[{'#' * filled}{'.' * (width - filled)}]"


def progress_line(m: dict[str, float], total: int) -> str:
  """One console line per step."""
  parts = [f"{progress_bar(m['step'], total)} step {m['step']}/{total}"]
  if "reward_mean" in m:
    parts += [f"reward {m['reward_mean']:+.3f}", f"acc {m['accuracy']:.3f}",
              f"len {m['response_length_mean']:.1f}"]
  if "finished_responses" in m:
    parts.append(f"done {m['finished_responses']:.0f}")
  if "entropy" in m:
    parts.append(f"ent {m['entropy']:.3f}")
  if "kept_groups_ratio" in m:
    parts.append(f"kept {m['kept_groups_ratio']:.2f}")
  if "value_loss" in m:
    parts.append(f"vloss {m['value_loss']:.4f}")
  if "eval_accuracy" in m:
    parts.append(f"EVAL {m['eval_accuracy']:.3f}")
  parts.append(f"{m.get('elapsed_s', 0):.0f}s")
  return " | ".join(parts)
