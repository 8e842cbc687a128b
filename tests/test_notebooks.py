"""Every notebook in colabs/ runs top to bottom, offline, on CPU."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

COLABS = sorted((pathlib.Path(__file__).parent.parent / "colabs").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", COLABS, ids=[p.name for p in COLABS])
def test_notebook_runs(path, tmp_path, monkeypatch):
  monkeypatch.setenv("MPLBACKEND", "Agg")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  notebook = nbformat.read(path, as_version=4)
  NotebookClient(notebook, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  errors = [o for cell in notebook.cells if cell.cell_type == "code"
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]
  assert not errors


def test_there_are_notebooks():
  assert COLABS, "colabs/ holds no notebook"
