"""The notebooks run top to bottom in a real Jupyter kernel (nbclient, ipykernel), on the tiny model.

The committed copies hold the outputs of ``scripts/execute_notebooks.py`` (the embedded model); here each one is
executed afresh and its outputs are checked, without writing it back.
"""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # a cell of notebook 03 trains a few steps; the tiny model takes seconds, not minutes


def _execute(path: Path) -> "nbformat.NotebookNode":
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()
    return notebook


def _outputs(notebook: "nbformat.NotebookNode") -> list[dict]:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel(path, monkeypatch):
    # The kernel is a child process: it inherits these (the tiny model; one torch thread, as the suite uses).
    monkeypatch.setenv("NOTEBOOK_MODEL", "tinker-cookbook/tiny-smollm2")
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    notebook = _execute(path)  # a cell that raises fails the test with its traceback (CellExecutionError)
    outputs = _outputs(notebook)
    assert not [o for o in outputs if o.output_type == "error"]
    assert all(cell.execution_count for cell in notebook.cells if cell.cell_type == "code")
    if path.name == "05_metrics.ipynb":
        images = [o for o in outputs if o.output_type in ("display_data", "execute_result")
                  and "image/png" in o.get("data", {})]
        assert len(images) >= 2  # the inline matplotlib figure and plot_metrics' PNG


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebooks_hold_their_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    # Every cell was run in order (cells that only define things print nothing), and the last one shows something.
    assert code and [cell.execution_count for cell in code] == list(range(1, len(code) + 1)) and code[-1].outputs, (
        f"{path.name} is not saved with its outputs: run scripts/execute_notebooks.py")
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
