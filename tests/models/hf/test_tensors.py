"""models/hf/tensors.py: the parameter ↔ HF tensor table of each family against the
safetensors file transformers writes for it (every tensor named once, each converted to
the shape of our parameter and back bit for bit), and the header check that runs on the
table before anything is loaded."""

from __future__ import annotations

import numpy as np
import pytest

from rlhf_jax import models
from rlhf_jax.models.hf.tensors import check_header_shapes
from rlhf_jax.models.hf.tensors import tensor_mappings
from tests.models.hf_fixtures import FAMILIES
from tests.models.hf_fixtures import save_family_model

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=tuple(FAMILIES))
def family(request, tmp_path_factory):
  """(our DecoderConfig, {HF name: array}) of a tiny checkpoint transformers saved."""
  from safetensors.numpy import load_file

  directory = tmp_path_factory.mktemp(request.param)
  save_family_model(directory, request.param)
  return (models.read_hf_config(str(directory)),
          load_file(str(directory / "model.safetensors")))


def test_the_table_names_every_tensor_transformers_writes(family):
  config, tensors = family
  names = [m.hf_name for m in tensor_mappings(config, "lm")]
  assert set(names) == set(tensors)
  # A name comes more than once only as the row blocks of one fused tensor (Phi-3).
  repeated = {n for n in names if names.count(n) > 1}
  assert all(m.rows is not None for m in tensor_mappings(config, "lm") if m.hf_name in repeated)


def test_each_tensor_converts_to_our_shape_and_back_bit_for_bit(family):
  config, tensors = family
  _, abstract = models.init_model(config, abstract=True)
  fused = {}  # HF name → its parts in our layout, back in HF's, in row order
  for mapping in tensor_mappings(config, "lm"):
    theirs = tensors[mapping.hf_name]
    if mapping.rows is not None:
      start, stop, total = mapping.rows
      assert theirs.shape[0] == total, mapping.hf_name
      theirs = theirs[start:stop]
    ours = abstract
    for key in mapping.path:
      ours = ours[key]
    want = ours.shape[1:] if mapping.expert is not None else ours.shape
    converted = mapping.to_ours(theirs)
    assert converted.shape == want, mapping.hf_name
    back = mapping.to_hf(converted)
    if mapping.rows is None:
      np.testing.assert_array_equal(back, theirs, err_msg=mapping.hf_name)
    else:
      fused.setdefault(mapping.hf_name, []).append(back)
  for name, parts in fused.items():
    np.testing.assert_array_equal(np.concatenate(parts), tensors[name], err_msg=name)


def test_the_header_check_passes_what_transformers_writes(family):
  config, tensors = family
  check_header_shapes(config, {name: array.shape for name, array in tensors.items()})


def test_the_header_check_names_the_tensor_that_does_not_fit(family):
  config, tensors = family
  shapes = {name: array.shape for name, array in tensors.items()}
  name = "model.layers.1.self_attn.o_proj.weight"
  rows, columns = shapes[name]
  with pytest.raises(ValueError, match=rf"^tensor '{name}' has shape \({rows}, "
                     rf"{columns + 1}\), layer 0's \({rows}, {columns}\)\.$"):
    check_header_shapes(config, {**shapes, name: (rows, columns + 1)})
  first = "model.layers.0.self_attn.o_proj.weight"
  with pytest.raises(ValueError, match=rf"^config.json does not fit tensor '{first}'"):
    check_header_shapes(config, {**shapes, first: (rows, columns + 1), name: (rows, columns + 1)})
  extra = {**shapes, "model.layers.2.input_layernorm.weight": (config.hidden_size,)}
  with pytest.raises(ValueError, match=r"num_hidden_layers=2, but the safetensors hold "
                     r"layers 0\.\.2 \(3 of them\)"):
    check_header_shapes(config, extra)
