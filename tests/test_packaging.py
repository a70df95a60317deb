"""Packaging: a distribution name of our own, example data shipped in a wheel and found there, install hints that
resolve to the right project and survive zsh."""

import glob
import re
import tomllib
from pathlib import Path

from tinker_cookbook.base import example_data

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_distribution_has_a_name_of_its_own():
    assert PYPROJECT["project"]["name"] == example_data.DISTRIBUTION == "tinker-cookbook-local"
    # The official cookbook's distribution is `tinker-cookbook`; the import package stays `tinker_cookbook`.
    assert "tinker_cookbook*" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]


def test_every_example_data_file_is_shipped_as_wheel_data():
    data_files = PYPROJECT["tool"]["setuptools"]["data-files"]
    shipped = {}
    for target, patterns in data_files.items():
        assert target.startswith(f"share/{example_data.DISTRIBUTION}/{example_data.EXAMPLE_DATA}")
        for pattern in patterns:
            for path in glob.glob(str(REPO / pattern)):
                relative = Path(path).relative_to(REPO / "example-data")
                shipped[str(relative)] = target  # a file lands in the folder its target names
                assert target.endswith(str(Path(example_data.EXAMPLE_DATA, relative).parent).rstrip("."))
    files = {str(p.relative_to(REPO / "example-data")) for p in (REPO / "example-data").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert files - set(shipped) == set(), "example-data files missing from [tool.setuptools.data-files]"


def test_example_data_is_found_in_the_checkout_or_else_where_a_wheel_puts_it(tmp_path, monkeypatch):
    assert example_data.example_data_dir() == REPO / "example-data"
    # After the checkout, the places pip puts a wheel's data: under the interpreter's prefix.
    assert str(example_data.candidate_dirs()[1]).endswith(f"share/{example_data.DISTRIBUTION}/example-data")
    installed = tmp_path / "share" / example_data.DISTRIBUTION / "example-data"
    installed.mkdir(parents=True)
    monkeypatch.setattr(example_data, "candidate_dirs", lambda: [tmp_path / "no-checkout", installed])
    assert example_data.example_data_path("conversations.jsonl") == installed / "conversations.jsonl"


def test_install_hints_name_packages_that_resolve_and_are_quoted():
    sources = [*(REPO / "tinker_cookbook").rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]
    for path in sources:
        for hint in re.findall(r"pip install [^`\n\"]*", path.read_text()):
            assert "tinker-cookbook[" not in hint and "tinker_cookbook[" not in hint, (path, hint)
            for spec in re.findall(r"\S*\[[^\]]*\]\S*", hint):  # an extra: quoted, or zsh globs the brackets
                assert spec.startswith("'"), (path, hint)
