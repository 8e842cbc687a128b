"""On-policy distillation (algorithms/distillation.py): the per-token advantage against a
NumPy reference of its formula, the teacher held as the learner's reference role, the
config rules, and a shrunken run of the loop."""

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_jax import batch as batch_lib
from rlhf_jax import models
from rlhf_jax import parallel
from rlhf_jax.algorithms import distillation
from rlhf_jax.algorithms import estimators
from rlhf_jax.algorithms import ppo_family
from rlhf_jax.algorithms import ppo_learner
from rlhf_jax.config_errors import ConfigError
from rlhf_jax.tasks import arith
from rlhf_jax.tasks import registry as task_registry

ROOT = pathlib.Path(__file__).resolve().parents[2]


def distill_preset(variant="arith"):
  """configs/distill.py:<variant>."""
  spec = importlib.util.spec_from_file_location("distill", ROOT / "configs" / "distill.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def random_rows(rows=8, prompt=3, response=6, seed=0):
  """A rollout batch of ragged random responses and scores."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, response + 1, rows)
  return batch_lib.build_rollout_batch(
      [list(rng.integers(1, 32, prompt)) for _ in range(rows)],
      [list(rng.integers(1, 32, n)) for n in lengths], [[0.0] * n for n in lengths],
      list(rng.normal(size=rows)), [False] * rows, [i // 4 for i in range(rows)],
      prompt_length=prompt, response_length=response, pad_id=0)


def random_batch(rows=8, prompt=3, response=6, seed=0):
  """`random_rows` prepared with student (old) and teacher (ref) log-probs random,
  nonzero past each row's end too, so a missing mask shows."""
  rng = np.random.default_rng(seed + 1)
  return batch_lib.TrainBatch.from_rollout(
      random_rows(rows, prompt, response, seed),
      old_logprobs=-rng.uniform(0.1, 5, (rows, response)).astype(np.float32),
      ref_logprobs=-rng.uniform(0.1, 5, (rows, response)).astype(np.float32))


def numpy_distill(student, teacher, mask, scores, *, task_coef, group_size, eps=1e-6):
  """A_t = (log π_teacher − log π_θ) · m_t + c · GRPO_i · m_t, GRPO_i = (R_i − mean_G R) /
  (std_G R + ε) with the sample std (Bessel), written from the formula."""
  out = (teacher - student) * mask
  if task_coef:
    grouped = scores.reshape(-1, group_size).astype(np.float64)
    grpo = (grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, ddof=1, keepdims=True)
                                                         + eps)
    out = out + task_coef * grpo.reshape(-1)[:, None] * mask
  return out


@pytest.mark.parametrize("task_coef", [0.0, 0.5])
def test_the_advantage_is_the_teacher_minus_student_log_prob_per_token(task_coef):
  """Through the estimator table as `ppo_family.advantages_and_returns` reads it: the
  masked per-token reverse-KL advantage, plus c × GRPO's advantage when c > 0."""
  algorithm = distill_preset().algorithm
  algorithm.distill.task_coef = task_coef
  batch = random_batch()
  advantages, returns = ppo_family.advantages_and_returns(
      algorithm, batch_lib.as_device(batch), jnp.float32(0.0), group_size=4)
  expected = numpy_distill(batch.old_logprobs, batch.ref_logprobs, batch.response_mask,
                           np.asarray(batch.scores), task_coef=task_coef, group_size=4)
  np.testing.assert_allclose(np.asarray(advantages), expected, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(advantages)[batch.response_mask == 0] == 0)
  assert not np.any(np.asarray(returns))  # no critic
  record = estimators.estimator("distill")
  assert record.needs_reference and not record.needs_critic and not record.group_based


def test_the_preset_needs_a_teacher_and_keeps_it_frozen(tmp_path):
  from rlhf_jax.training.config import validate_config
  c = distill_preset()
  # The PPO learner's spec runs these rules with every config's validation.
  with pytest.raises(ConfigError, match=r"config\.algorithm\.distill\.teacher: .*required"):
    validate_config(c, num_devices=1)
  with pytest.raises(ConfigError, match=r"config\.algorithm\.distill\.teacher: .*required"):
    ppo_learner.validate_run(c, fixed_data=False)
  c.algorithm.distill.teacher = str(tmp_path)
  ppo_learner.validate_run(c, fixed_data=False)
  c.algorithm.kl.reference_ema = 0.1
  with pytest.raises(ConfigError, match=r"config\.algorithm\.kl\.reference_ema: "):
    ppo_learner.validate_run(c, fixed_data=False)
  c.algorithm.kl.reference_ema = 0.0
  c.algorithm.distill.task_coef, c.rollout.group_size = 0.5, 1
  with pytest.raises(ConfigError, match=r"config\.rollout\.group_size: .*distill"):
    ppo_learner.validate_run(c, fixed_data=False)
  c.algorithm.distill.task_estimator = "gae"
  with pytest.raises(ConfigError, match=r"config\.algorithm\.distill\.task_estimator: "):
    ppo_learner.validate_run(c, fixed_data=False)


def test_named_by_module_path_it_keeps_the_teachers_rules():
  c = distill_preset()
  c.algorithm.advantage.estimator = "rlhf_jax.algorithms.distillation:DISTILL"
  assert distillation.is_distilling(c.algorithm)
  with pytest.raises(ConfigError, match=r"config\.algorithm\.distill\.teacher: .*required"):
    ppo_learner.validate_run(c, fixed_data=False)


def test_a_bad_task_estimator_is_named_as_its_own_field():
  section = distill_preset().algorithm.distill
  section.task_coef, section.task_estimator = 0.5, "grpoo"
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.distill\.task_estimator: "):
    distillation.check_distill_fields(section)


def test_its_per_token_advantages_are_refused_by_a_sequence_clip():
  """GSPO takes one advantage per response; the teacher's advantages vary per token."""
  from rlhf_jax.algorithms import ppo_config
  assert estimators.estimator("distill").token_advantages
  a = distill_preset().algorithm
  a.policy_loss.kind = "gspo"
  with pytest.raises(ConfigError, match=r"config\.algorithm\.policy_loss\.kind: .*'distill'"):
    ppo_config.validate_algorithm_config(a, group_size=4, response_length=16)
  a.policy_loss.kind = "gspo_token"
  ppo_config.validate_algorithm_config(a, group_size=4, response_length=16)


def save_arith_model(directory, *, hidden_size, num_layers, num_heads, seed, vocab_pad=0,
                     tokenizer=None):
  """A random arith-task checkpoint (the task's tokenizer, or `tokenizer`) of the given
  size, its embedding padded with `vocab_pad` rows no token uses (as Qwen2.5's are)."""
  tokenizer = tokenizer or task_registry.get_task("arith").tokenizer()
  model, params = models.init_model(arith.model_config(
      vocab_size=tokenizer.vocab_size + vocab_pad, hidden_size=hidden_size,
      num_layers=num_layers, num_heads=num_heads, max_positions=128), seed=seed)
  models.save_policy(str(directory), model, params, tokenizer, list(arith.PROMPT_PREFIX))
  return models.load_hf_checkpoint(str(directory))


@pytest.mark.slow  # 13 s: two checkpoints loaded and compared leaf by leaf
def test_the_teacher_role_holds_the_teachers_weights(tmp_path):
  """A teacher twice the student's width and depth from its checkpoint: the learner's
  reference scores a batch exactly as a direct forward of the teacher does, and the
  prepared advantages are that minus the student's log-probs."""
  teacher_model, teacher_params = save_arith_model(tmp_path / "teacher", hidden_size=32,
                                                   num_layers=2, num_heads=2, seed=1)
  student_model, student_params = save_arith_model(tmp_path / "student", hidden_size=16,
                                                   num_layers=1, num_heads=2, seed=2)
  c = distill_preset()
  c.model.checkpoint = str(tmp_path / "student")  # the tokenizers are compared too
  c.algorithm.distill.teacher = str(tmp_path / "teacher")
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  learner = ppo_learner.PPOLearner.from_config(c, student_model, student_params, mesh)
  assert learner.reference.model.config.hidden_size == 32
  batch = batch_lib.as_device(random_rows(rows=8, seed=3))
  direct = np.asarray(batch_lib.response_logprobs(teacher_model, teacher_params, batch))
  held = np.asarray(batch_lib.response_logprobs(learner.reference.model,
                                                learner.reference.params, batch))
  np.testing.assert_allclose(held, direct, rtol=1e-6, atol=1e-6)
  student = batch_lib.response_logprobs(student_model, student_params, batch)
  # The student's own samples: the sampler's log-probs are its forward's.
  batch = batch.replace(sampler_logprobs=student,
                        token_versions=jnp.zeros_like(batch.token_versions))
  student = np.asarray(student)
  mask = np.asarray(batch.response_mask)
  assert np.abs(student - direct)[mask > 0].min() > 0
  prepared, _, _ = learner._prepare(learner.actor.params, learner.reference.params, None,
                                    learner.kl_coef, jnp.int32(0), batch, None)
  np.testing.assert_allclose(np.asarray(prepared.ref_logprobs), direct, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(prepared.advantages), (direct - student) * mask,
                             rtol=1e-5, atol=1e-5)


def test_a_teacher_of_another_vocabulary_is_refused(tmp_path):
  save_arith_model(tmp_path / "teacher", hidden_size=16, num_layers=1, num_heads=2, seed=1)
  config = models.DecoderConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=24)
  student_model, student_params = models.init_model(config, seed=0)
  c = distill_preset()
  c.algorithm.distill.teacher = str(tmp_path / "teacher")
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  with pytest.raises(ConfigError, match=r"config\.algorithm\.distill\.teacher: .*vocabulary"):
    ppo_learner.PPOLearner.from_config(c, student_model, student_params, mesh)


def numpy_log_softmax_at(logits, targets):
  """log softmax(z)[target] per position, in float64, written from the formula."""
  z = logits.astype(np.float64)
  z = z - z.max(-1, keepdims=True)
  logz = np.log(np.exp(z).sum(-1))
  return np.take_along_axis(z, targets[..., None], -1)[..., 0] - logz


def test_a_teacher_with_a_larger_padded_vocabulary_scores_over_the_shared_one(tmp_path):
  """Qwen2.5-7B (152064 rows) teaching 1.5B (151936), one tokenizer: here embeddings padded
  by 12 and 3 rows over the arith tokenizer. Accepted; the teacher's log-probs are its full
  logits cut to the student's ids and renormalised (a NumPy log-softmax over them), not its
  log-softmax over all its rows."""
  teacher_model, teacher_params = save_arith_model(
      tmp_path / "teacher", hidden_size=32, num_layers=2, num_heads=2, seed=1, vocab_pad=12)
  student_model, student_params = save_arith_model(
      tmp_path / "student", hidden_size=16, num_layers=1, num_heads=2, seed=2, vocab_pad=3)
  shared = student_model.config.vocab_size
  assert teacher_model.config.vocab_size == shared + 9
  c = distill_preset()
  c.model.checkpoint = str(tmp_path / "student")
  c.algorithm.distill.teacher = str(tmp_path / "teacher")
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  learner = ppo_learner.PPOLearner.from_config(c, student_model, student_params, mesh)
  assert learner.reference.model.config.vocab_size == shared
  batch = batch_lib.as_device(random_rows(rows=8, seed=3))
  # Both forwards jitted: op by op they took most of the test's time.
  held = np.asarray(jax.jit(lambda params, b: batch_lib.response_logprobs(
      learner.reference.model, params, b))(learner.reference.params, batch))
  logits = jax.jit(lambda params, tokens, mask: teacher_model.apply(
      params, tokens, attention_mask=mask)[0])(teacher_params, batch.tokens,
                                               batch.attention_mask)
  prompt, response = batch.tokens.shape[1] - batch.response_length, batch.response_length
  logits = np.asarray(logits)[:, prompt - 1:prompt + response - 1]
  targets = np.asarray(batch.tokens)[:, prompt:]
  mask = np.asarray(batch.response_mask)
  expected = numpy_log_softmax_at(logits[..., :shared], targets) * mask
  np.testing.assert_allclose(held, expected, rtol=1e-5, atol=1e-5)
  over_all_rows = numpy_log_softmax_at(logits, targets) * mask
  assert np.abs(held - over_all_rows)[mask > 0].min() > 1e-4  # the cut shows


def test_a_teacher_with_fewer_rows_or_another_tokenizer_is_refused_in_one_line(tmp_path):
  save_arith_model(tmp_path / "student", hidden_size=16, num_layers=1, num_heads=2, seed=2,
                   vocab_pad=3)
  student_model, student_params = models.load_hf_checkpoint(str(tmp_path / "student"))
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  c = distill_preset()
  c.model.checkpoint = str(tmp_path / "student")
  c.algorithm.distill.teacher = str(tmp_path / "small")
  save_arith_model(tmp_path / "small", hidden_size=16, num_layers=1, num_heads=2, seed=1)
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.distill\.teacher: .*small: its "
                     r"vocabulary has \d+ rows, fewer than the policy's") as error:
    ppo_learner.PPOLearner.from_config(c, student_model, student_params, mesh)
  assert "\n" not in str(error.value)
  # The same size, the characters in another order: another token → id map.
  shuffled = models.build_character_tokenizer(arith.ALPHABET[::-1])
  save_arith_model(tmp_path / "other", hidden_size=16, num_layers=1, num_heads=2, seed=1,
                   vocab_pad=3, tokenizer=shuffled)
  c.algorithm.distill.teacher = str(tmp_path / "other")
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.distill\.teacher: .*other: its "
                     r"tokenizer differs from the policy's"):
    ppo_learner.PPOLearner.from_config(c, student_model, student_params, mesh)
  # Both before any weight loads too (the launchers' pre-work check, --validate_only).
  from rlhf_jax.training import inputs
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.distill\.teacher: .*other: its "
                     r"tokenizer differs from the policy's"):
    inputs.check_data(c, str(tmp_path / "run"))
  c.algorithm.distill.teacher = str(tmp_path / "small")
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.distill\.teacher: .*small: its "
                     r"vocabulary has \d+ rows, fewer than the policy's"):
    inputs.check_data(c, str(tmp_path / "run"))
  save_arith_model(tmp_path / "padded", hidden_size=16, num_layers=1, num_heads=2, seed=1,
                   vocab_pad=8)
  c.algorithm.distill.teacher = str(tmp_path / "padded")
  inputs.check_data(c, str(tmp_path / "run"))


def test_dynamic_sampling_with_pure_distillation_is_refused_in_one_line(tmp_path):
  """The teacher's term is nonzero in every group: dynamic sampling's filter on the reward
  would keep or drop groups by a signal nothing trains on. A task term makes it useful."""
  from rlhf_jax.training.config import validate_config
  c = distill_preset()
  c.algorithm.distill.teacher = str(tmp_path)
  c.rollout.mode = "dynamic"
  with pytest.raises(ConfigError, match=r"^config\.rollout\.mode: invalid value 'dynamic': "
                     r".*pure distillation") as error:
    validate_config(c, num_devices=1)
  assert "\n" not in str(error.value)
  c.algorithm.distill.task_coef = 0.5
  ppo_learner.validate_run(c, fixed_data=False)


def sampler_route_config(tmp_path, teacher_dir, address):
  """The distill preset on the student checkpoint of `tmp_path`, the teacher's log-probs
  from the sampling server at `address`."""
  c = distill_preset()
  c.model.checkpoint = str(tmp_path / "student")
  c.algorithm.distill.teacher = str(teacher_dir)
  c.sampler.address = address
  c.rollout.reference_logprobs = "sampler"
  return c


@pytest.fixture()
def student_server(tmp_path):
  """A student checkpoint in tmp_path/student and an in-process sampling server of its
  architecture, started on other weights (the trainer pushes its own); yields
  (server address, student model, student params)."""
  from rlhf_jax import sampling
  from rlhf_jax.sampling.serve import server as server_lib
  from rlhf_jax.sampling.scheduler.scheduler import Scheduler
  model, params = save_arith_model(tmp_path / "student", hidden_size=16, num_layers=1,
                                   num_heads=2, seed=2)
  _, other = models.init_model(model.config, seed=99)
  scheduler = Scheduler(sampling.Engine(model, num_slots=2, cache_length=16), other,
                        prompt_buckets=(8,))
  server, port, service = server_lib.start_server(scheduler, port=0, max_workers=4)
  try:
    yield f"localhost:{port}", model, params
  finally:
    server.stop(grace=None)
    service.stop()


@pytest.mark.slow
def test_the_sampling_servers_score_with_a_teacher_of_the_students_architecture(
    tmp_path, student_server):
  """rollout.reference_logprobs='sampler' with a teacher: building the sampler sends the
  server the teacher's weights as its reference, and the batch's ref_logprobs are a direct
  forward of the teacher (not of the initial policy); the learner holds no copy."""
  from rlhf_jax.rollout import reference as reference_lib
  from rlhf_jax.training import build
  from rlhf_jax.training.config import validate_config
  from rlhf_jax.rollout.generation import Rollouts
  from tests.fakes import FakeRollout
  address, student_model, student_params = student_server
  teacher_model, teacher_params = save_arith_model(tmp_path / "teacher", hidden_size=16,
                                                   num_layers=1, num_heads=2, seed=1)
  c = sampler_route_config(tmp_path, tmp_path / "teacher", address)
  validate_config(c, num_devices=1)  # refused before: the servers held the policy only
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  policy = build.load_policy(c, str(tmp_path), mesh)
  sampler = build.build_sampler(c, policy, mesh)
  try:
    rows = random_rows(rows=4, prompt=3, response=6, seed=4)
    inner = FakeRollout()
    inner.collect = lambda: Rollouts(batch=rows, correct=[], failures=[], metrics={})
    batch = reference_lib.SamplerReferenceRollout(inner, sampler).collect().batch
  finally:
    sampler.close()
  teacher = np.asarray(batch_lib.response_logprobs(teacher_model, teacher_params, rows))
  student = np.asarray(batch_lib.response_logprobs(student_model, student_params, rows))
  mask = rows.response_mask
  np.testing.assert_allclose(batch.ref_logprobs, teacher, atol=2e-5)
  assert np.abs(student - teacher)[mask > 0].min() > 1e-3  # not the initial policy's
  assert ppo_learner.reference_role(c, policy.model, policy.params, mesh) is None


def test_the_sampling_servers_refuse_a_teacher_of_another_size_in_one_line(
    tmp_path, student_server):
  from rlhf_jax.training import build
  address, _, _ = student_server
  save_arith_model(tmp_path / "teacher", hidden_size=32, num_layers=2, num_heads=2, seed=1)
  c = sampler_route_config(tmp_path, tmp_path / "teacher", address)
  mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  policy = build.load_policy(c, str(tmp_path), mesh)
  with pytest.raises(ConfigError, match=r"^config\.algorithm\.distill\.teacher: .*"
                     r"architecture differs .*hidden_size 32≠16.*num_layers 2≠1.*"
                     r"in-process route .*any size") as error:
    distillation.sampler_reference_params(c, policy.model, policy.params, mesh)
  assert "\n" not in str(error.value)
  with pytest.raises(ConfigError, match=r"architecture differs"):
    build.build_sampler(c, policy, mesh)  # before the reference is sent


@pytest.mark.slow
def test_a_shrunken_distillation_run(tmp_path):
  """The loop, unchanged, distils: a 2-layer teacher checkpoint, the student's 3-step arith
  warm start, two steps with the distill preset; the student's weights move and every
  logged step has finite losses."""
  from rlhf_jax.training import loop
  from rlhf_jax.training import stages
  from rlhf_jax.training.config import validate_config
  c = distill_preset()
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 16, 1, 2
  c.sft.steps, c.sft.batch_size = 3, 8
  c.data.num_train, c.data.num_eval = 32, 8
  c.data.levels = c.sft.levels = (1,)  # worked solutions of <= 45 tokens
  c.data.level_weights = c.sft.level_weights = (1.0,)
  c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_new_tokens = 4, 2, 48
  c.sampler.num_slots, c.sampler.cache_length, c.sampler.warmup = 8, 64 + 48, False
  c.train.steps, c.train.eval_every, c.train.eval_samples = 2, 2, 0
  save_arith_model(tmp_path / "teacher", hidden_size=32, num_layers=2, num_heads=2, seed=1)
  c.algorithm.distill.teacher = str(tmp_path / "teacher")
  validate_config(c, num_devices=1)
  workdir = tmp_path / "run"
  stages.ensure_arith_warm_start(c, str(workdir), log=lambda line: None)
  trainer = loop.Trainer(c, str(workdir), log=lambda line: None)
  assert trainer.learner.reference.model.config.num_layers == 2
  before = jax.tree.map(np.asarray, trainer.learner.policy_params)
  summary = trainer.run()
  assert summary["steps"] == 2
  logged = [json.loads(line) for line in open(workdir / "metrics.jsonl")][1:]
  assert len(logged) == 2 and all(np.isfinite(r["loss"]) for r in logged)
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)),
                                       before, trainer.learner.policy_params))
  assert any(moved)
  # The teacher stays out of the checkpoint; a resumed run loads the configured one.
  assert "reference" not in trainer.learner.state()
  teacher = jax.tree.map(np.asarray, trainer.learner.reference.params)
  trainer.close()
  resumed = loop.Trainer(c, str(workdir), log=lambda line: None)
  assert resumed.step == 2
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)),
                                          teacher, resumed.learner.reference.params)))
  resumed.close()
