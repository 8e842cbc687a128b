"""The generative judge's checks (rewards/judge.py): templates name their placeholders, and
verdicts are single, distinct tokens, one line naming the field."""

from __future__ import annotations

import pytest

from rlhf_jax.config_errors import ConfigError
from rlhf_jax.rewards import genrm
from rlhf_jax.rewards.judge import verdict_token_ids
from tests.rewards.tiny_lm import TOKENIZER


def test_templates_name_their_placeholders():
  from rlhf_jax.rewards.judge import check_template
  check_template(genrm.GT_TEMPLATE, genrm.TEMPLATE_FIELDS["gt"], ("answer", "response"), "t")
  for bad, match in (("{prompt}{response}", "missing: \\['answer'\\]"),
                     ("{prompt}{answer}{response}{}", "unknown: \\[''\\]"),
                     ("{answer}{response}{extra}", "unknown: \\['extra'\\]")):
    with pytest.raises(ValueError, match=match):
      check_template(bad, genrm.TEMPLATE_FIELDS["gt"], ("answer", "response"), "t")


def test_verdicts_must_be_single_distinct_tokens():
  with pytest.raises(ConfigError, match=r"^config\.reward\.genrm\.yes: invalid value 'Yes': "
                     r"is \d+ tokens .*exactly one token") as error:
    verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Yes", "reward.genrm.no": "N"})
  assert error.value.field == "reward.genrm.yes"
  with pytest.raises(ConfigError, match=r"^config\.reward\.genrm\.no: invalid value 'Y': "
                     r"shares its token with reward\.genrm\.yes") as error:
    verdict_token_ids(TOKENIZER, {"reward.genrm.yes": "Y", "reward.genrm.no": "Y"})
  assert error.value.field == "reward.genrm.no"
