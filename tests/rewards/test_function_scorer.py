"""The scorer of `reward.function` (rewards/function_scorer.py): TRL's and verl's signatures,
called as those libraries call them, in killable workers; failures cost their samples, never
the run."""

import dataclasses

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.data import Example
from rlhf_jax.rewards import functions
from rlhf_jax.rewards.function_scorer import FunctionScorer
from rlhf_jax.rewards.function_scorer import columns_of
from rlhf_jax.rewards.scorer import Completion
from rlhf_jax.training.config import base_config
from rlhf_jax.training.config import validate_config

FNS = "tests.rewards.reward_fns"


def scorer(*names, weights="", timeout_s=5.0, monitor=None, monitor_tasks=()):
  parsed = functions.parse_functions(",".join(f"{FNS}:{n}" for n in names), weights)
  return FunctionScorer(parsed, render_prompt=lambda e: f"<{e.prompt}>",
                        encode=lambda text: [ord(c) for c in text], monitor=monitor,
                        monitor_tasks=monitor_tasks, failure_score=-7.0,
                        timeout_s=timeout_s, workers=1)


def rows(*completions, **metadata):
  return [Example(f"q{i}", str(i), "mytask", {k: v[i] for k, v in metadata.items()})
          for i in range(len(completions))], list(completions)


def test_trl_function_gets_the_files_own_columns_and_prompts_as_rendered():
  examples, completions = rows("a", "b ", "c", solution=["a", "b", "x"])
  with scorer("solution_match", "echo_columns", weights="10,1") as s:
    out = s.score(examples, completions)
    # 10 × match + (1000 × len("<q_i>") + completion ids)
    assert out.scores == [10 + 4000 + 1, 10 + 4000 + 2, 0 + 4000 + 1]
    # correct = full marks from every function: solution_match gave 0 to the third
    assert out.failures == ["", "", ""] and out.correct == [True, True, False]
    metrics = s.pop_metrics()
  assert metrics["reward/solution_match/mean"] == pytest.approx(2 / 3)
  assert metrics["reward/echo_columns/failure_rate"] == 0.0


def test_sampled_token_ids_are_passed_when_the_response_carries_them():
  examples, _ = rows("x")
  with scorer("echo_columns") as s:
    assert s.score(examples, [Completion("x", [1, 2, 3, 4, 5])]).scores == [4000 + 5]


def test_functions_get_only_the_arguments_they_name():
  examples, completions = rows("a", "b", solution=["a", "x"])
  with scorer("verl_without_extra_info", "trl_named_only") as s:
    out = s.score([dataclasses.replace(e, answer=c) for e, c in zip(examples, ["a", "y"])],
                  completions)
    assert out.failures == ["", ""] and out.scores == [2.0, 0.0]


def test_columns_are_lists_with_none_where_a_row_lacks_one():
  examples = [Example("p", "1", "t", {"solution": "s"}), Example("p", "2", "u", {"k": 3})]
  assert columns_of(examples) == {"solution": ["s", None], "k": [None, 3],
                                  "answer": ["1", "2"], "task": ["t", "u"]}


def test_verl_compute_score_per_sample_with_its_logged_extras():
  examples = [Example("q", "42", "math", {"data_source": "openai/gsm8k",
                                          "extra_info": {"index": 7}}),
              Example("q", "5", "mytask")]
  with scorer("compute_score") as s:
    out = s.score(examples, ["42", "6"])
    assert out.scores == [1.0, 0.0] and out.correct == [True, False]
    metrics = s.pop_metrics()
  assert metrics["reward/compute_score/length"] == 1.5
  # data_source falls back to the task; extra_info to None
  assert metrics["reward/compute_score/source_is_gsm8k"] == 0.5
  assert metrics["reward/compute_score/index"] == (7 - 1) / 2


def test_partial_credit_is_reward_but_not_a_correct_answer():
  examples, completions = rows("a", "bb")
  with scorer("half_credit") as s:
    out = s.score(examples, completions)
    assert out.scores == [1.0, 0.5] and out.correct == [True, False]
  with scorer("verl_with_acc") as s:  # verl's own "acc" decides where the dict has one
    out = s.score(examples, completions)
    assert out.scores == [0.25, 0.25] and out.correct == [True, False]


def test_async_functions_are_awaited_and_none_means_not_scored():
  examples, completions = rows("ab", "abcd")
  with scorer("async_length", "only_short") as s:
    assert s.score(examples, completions).scores == [2.0 + 1.0, 4.0]
  with scorer("only_short") as s:  # TRL: None is NaN, nansum: a sample none scores gets 0
    out = s.score(examples, completions)
    assert out.scores == [1.0, 0.0] and out.failures == ["", ""]
    assert out.reason(1) == "no reward function scored it"
    assert s.pop_metrics()["reward/unscored_samples"] == 1.0


def test_unscored_samples_are_counted_on_the_console_and_can_be_failures(caplog):
  examples, completions = rows("ab", "abcd", "abcdef")
  with scorer("only_short") as s:
    s.score(examples, completions)
    with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
      s.pop_metrics()
  assert ("reward: 2 of 3 samples were scored by no reward function (every one returned "
          "None): they get 0 (reward.unscored='zero')") in caplog.messages
  parsed = functions.parse_functions(f"{FNS}:only_short")
  with FunctionScorer(parsed, render_prompt=str, encode=list, failure_score=-7.0,
                      unscored="failure", workers=1) as s:
    out = s.score(examples, completions)
  assert out.scores == [1.0, -7.0, -7.0]
  assert out.failures[1].startswith("no reward function scored it")
  with FunctionScorer(parsed, render_prompt=str, encode=list, unscored="drop",
                      workers=1) as s:
    out = s.score(examples, completions)
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
      s.pop_metrics()
  assert out.scored == [True, False, False] and out.failures == ["", "", ""]
  assert out.reason(2).startswith("no reward function scored it (dropped")
  assert any("they leave their groups' statistics and the loss (reward.unscored='drop')"
             in m for m in caplog.messages)


@pytest.mark.parametrize("name, reason", [
    ("raises", "reward.function raises: raised RuntimeError: boom"),
    ("unprintable_error", "reward.function unprintable_error: raised _Unprintable (its "
                          "message could not be read)"),
    ("wrong_length", "reward.function wrong_length: returned 1 rewards for 2 samples"),
    ("wrong_type", "reward.function wrong_type: returned str 'high'"),
    ("not_a_list", "reward.function not_a_list: returned float, not a list of rewards"),
    ("hangs", "reward.function hangs: timeout after 1 s"),
])
def test_a_failing_function_fails_its_samples_not_the_run(name, reason, caplog):
  examples, completions = rows("a", "b")
  with scorer(name, timeout_s=1.0) as s:
    out = s.score(examples, completions)
    assert out.scores == [-7.0, -7.0] and out.correct == [False, False]
    assert all(f.startswith(reason) for f in out.failures), out.failures
    with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
      metrics = s.pop_metrics()
    assert metrics[f"reward/{name}/failure_rate"] == 1.0
    assert metrics[f"reward/{name}/failures"] == 2.0
    # one console line: the function, the count and the first reason
    line = f"reward function {name} failed on 2 of 2 samples: "
    shown = [m for m in caplog.messages if m.startswith(line)]
    assert shown == [line + out.failures[0].partition(": ")[2]], caplog.messages
    if name == "hangs":  # the pool replaced the killed worker: the next call works
      s.functions = functions.parse_functions(f"{FNS}:async_length")
      assert s.score(examples, completions).scores == [1.0, 1.0]


class Verdicts:
  """A monitor that calls a completion correct when it is "right"."""
  def score(self, examples, responses):
    from rlhf_jax.rewards.scorer import Scores
    return Scores([0.0] * len(responses), [r == "right" for r in responses],
                  [""] * len(responses))

  def pop_metrics(self):
    return {"reward/math/accuracy": 0.5}

  def close(self):
    pass


def test_the_rule_verifier_decides_correctness_where_the_task_has_one():
  examples = [Example("q", "1", "math"), Example("q", "1", "math"), Example("q", "1", "free")]
  with scorer("async_length", monitor=Verdicts(), monitor_tasks=("math",)) as s:
    out = s.score(examples, ["right", "wrong", "zz"])
    assert out.scores == [5.0, 5.0, 2.0]
    assert out.correct == [True, False, True]  # verifier, verifier, full marks (2 >= 1)
    assert s.pop_metrics()["reward/math/accuracy"] == 0.5


def test_a_function_by_file_path(tmp_path):
  path = tmp_path / "my_reward.py"
  path.write_text("def reward(prompts, completions, **kw):\n"
                  "  return [float(c == 'yes') for c in completions]\n")
  with FunctionScorer(functions.parse_functions(f"{path}:reward"), render_prompt=str,
                      encode=list, workers=1) as s:
    assert s.score(rows("yes", "no")[0], ["yes", "no"]).scores == [1.0, 0.0]


def test_rewards_that_are_inf_in_float32_fail_their_samples(tmp_path):
  # 1e39 passes math.isfinite but is inf in float32 (the batch's dtype); 3e38 is finite
  # there, but two of them summed are not.
  path = tmp_path / "big_reward.py"
  path.write_text("def big(prompts, completions, **kw):\n"
                  "  return [{'huge': 1e39, 'max': 3e38, 'one': 1.0}[c] for c in completions]\n"
                  "def big_verl(data_source, solution_str, ground_truth):\n"
                  "  return {'score': 1e39 if solution_str == 'huge' else 1.0}\n")
  examples, completions = rows("huge", "max", "one")
  with FunctionScorer(functions.parse_functions(f"{path}:big,{path}:big"), render_prompt=str,
                      encode=list, failure_score=-7.0, workers=1) as s:
    out = s.score(examples, completions)
  assert out.scores == [-7.0, -7.0, 2.0]
  assert out.failures[0] == ("reward.function big: returned float 1e+39, not a number "
                             "finite in float32")
  assert out.failures[1] == "the weighted sum 6e+38 is not finite in float32"
  assert out.failures[2] == ""
  with FunctionScorer(functions.parse_functions(f"{path}:big_verl"), render_prompt=str,
                      encode=list, failure_score=-7.0, workers=1) as s:
    out = s.score(*rows("huge", "one"))
  assert out.scores == [-7.0, 1.0] and "not a number finite in float32" in out.failures[0]


def test_a_trl_function_gets_the_whole_step_in_one_call_in_row_order():
  # 40 samples: more than any chunk; a function that normalises across the batch sees all
  examples, completions = rows(*[str(i) for i in range(40)])
  with scorer("batch_size", "echo_columns", weights="1,0.000001") as s:
    out = s.score(examples, completions)
  lengths = [len(str(i)) for i in range(40)]
  expected = [40.0 + 1e-6 * (1000.0 * len(f"<q{i}>") + lengths[i]) for i in range(40)]
  assert out.scores == pytest.approx(expected, rel=1e-12)


def test_numpy_array_results_are_rewards():
  examples, completions = rows("a", "bbb")
  with scorer("numpy_lengths") as s:
    assert s.score(examples, completions).scores == [1.0, 3.0]


def test_async_functions_share_one_event_loop_per_worker():
  examples, completions = rows("ab", "abcd", "a")
  with scorer("async_bounded") as s:
    for _ in range(3):  # a new loop per call fails from the second call on
      out = s.score(examples, completions)
      assert out.scores == [2.0, 4.0, 1.0], out.failures


def test_what_a_function_prints_is_captured_bounded_and_shown_once(caplog, capfd):
  examples, completions = rows("a", "b")
  with scorer("chatty") as s:
    assert s.score(examples, completions).scores == [1.0, 1.0]
    with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
      metrics = s.pop_metrics()
  printed = 3000 * 1024 + len("done\n")
  assert metrics["reward/chatty/output_bytes"] == printed
  shown = [m for m in caplog.messages if m.startswith("reward function chatty printed")]
  assert len(shown) == 1 and len(shown[0]) < 1200, shown
  assert shown[0].startswith(f"reward function chatty printed {printed} bytes (")
  assert len(capfd.readouterr().out) < 10_000  # not the 3 MB


def test_what_a_function_printed_before_it_raised_is_shown(caplog):
  examples, completions = rows("a", "b")
  with scorer("prints_then_raises") as s:
    out = s.score(examples, completions)
    assert out.failures[0] == "reward.function prints_then_raises: raised KeyError: 'answer'"
    with caplog.at_level("WARNING", logger="rlhf_jax.rewards"):
      s.pop_metrics()
  assert any("diagnostic: the answer column is missing" in m for m in caplog.messages)


def test_a_verl_bool_score_is_a_number():
  examples, completions = rows("0", "x")  # answers "0", "1"
  with scorer("verl_bool_score") as s:
    out = s.score(examples, completions)
  assert out.scores == [1.0, 0.0] and out.failures == ["", ""]


def test_dropping_unscored_samples_needs_whole_response_groups_and_the_functions_alone():
  c = base_config("arith")
  c.reward.function, c.reward.unscored = f"{FNS}:only_short", "drop"
  validate_config(c)  # groups of whole responses, the functions are the reward
  c.reward.route = "hybrid"
  with pytest.raises(ConfigError, match=r"config\.reward\.unscored: invalid value 'drop': "
                     r"needs reward\.route='verifier'"):
    validate_config(c)
  from configs import tppo
  t = tppo.get_config("arith")
  t.reward.function, t.reward.unscored = f"{FNS}:only_short", "drop"
  with pytest.raises(ConfigError, match=r"config\.reward\.unscored: invalid value 'drop': "
                     r"works with rollout\.mode 'groups' or 'dynamic', not 'windows'"):
    validate_config(t)
