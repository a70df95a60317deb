"""Execute the notebooks in a Jupyter kernel and save them with their outputs (what a code host renders).

    .venv/bin/python scripts/execute_notebooks.py                      # every notebook, embedded model
    .venv/bin/python scripts/execute_notebooks.py notebooks/03_supervised_learning.ipynb

Run from the repository root; the kernel works there too, so ``recipes`` and ``example-data`` resolve. The
notebooks use ``HuggingFaceTB/SmolLM2-135M-Instruct`` unless ``NOTEBOOK_MODEL`` names another model.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import nbclient
import nbformat

REPO = Path(__file__).resolve().parent.parent
CELL_TIMEOUT_S = 1800


WARNING_LINE = re.compile(r"\w+Warning: ")


def without_warnings(text: str) -> str:
    """``text`` without Python warnings (a ``...Warning: ...`` line and the indented source line after it): they
    name files of the machine that ran the notebook and say nothing to a reader."""
    kept, in_warning = [], False
    for line in text.splitlines(keepends=True):
        if WARNING_LINE.search(line):
            in_warning = True
            continue
        if in_warning and line.startswith(" "):
            continue
        in_warning = False
        kept.append(line)
    return "".join(kept)


def clean(notebook: nbformat.NotebookNode) -> None:
    """Drop the warnings from the cells' stderr outputs (and outputs left empty by that), and write paths inside the
    checkout relative to it (``example-data/...``), as a reader's own checkout has them."""
    prefix = f"{REPO}/"
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            if output.output_type == "stream":
                text = without_warnings(output.text) if output.name == "stderr" else output.text
                output.text = text.replace(prefix, "")
            elif "text/plain" in output.get("data", {}):
                output.data["text/plain"] = output.data["text/plain"].replace(prefix, "")
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and not o.text.strip())]


def execute(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    start = time.monotonic()
    nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    clean(notebook)
    nbformat.write(notebook, path)
    print(f"{path}: executed in {time.monotonic() - start:.0f} s", flush=True)


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or sorted((REPO / "notebooks").glob("*.ipynb"))
    for path in paths:
        execute(path)


if __name__ == "__main__":
    main(sys.argv[1:])
