"""The import layering rule, checked on the source (see ``tinker_cookbook/base/__init__.py``).

- base (``tinker_cookbook.base``, ``.exceptions``, ``.perf_env``, the package ``__init__``): itself only;
- contract (``tinker_cookbook.tinker``): base and itself, never the engine: its clients talk to the ``Backend``
  interface (``tinker_cookbook.tinker.backend``), and the backend comes from the wiring module, which the contract
  imports by name on first use;
- engine (``tinker_cookbook.engine``): base, the contract's ``types`` and ``errors``, and itself;
- wiring (``tinker_cookbook.backends``): picks the backend for a base URL, so it may import the engine, the
  contract (its private modules too: the remote backend is one) and base; the engine and the contract never
  import it;
- cookbook (everything else in ``tinker_cookbook`` and ``recipes``, including the server): base, the public API,
  the wiring module and itself; never the engine. The server (``tinker_cookbook.server``) is an adapter over the
  API's ``Backend`` interface that uses the renderers and tokenizers;
- bench (``bench/``): measurement scripts, users of the cookbook like any other, so the cookbook's rule holds for
  them, except that the benches that time the engine's own parts (``ENGINE_BENCHES``) may import the engine.
  Nothing in the package imports a bench.

Private contract modules (``tinker_cookbook.tinker._*``, and private names of the contract's modules) are imported
only by the contract itself and the wiring module: everyone else uses the public API.

Every import statement counts, including those inside functions and ``TYPE_CHECKING`` blocks, so that a lazy import
cannot hide a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASE_MODULES = {"tinker_cookbook", "tinker_cookbook.exceptions", "tinker_cookbook.perf_env"}
WIRING_MODULES = {"tinker_cookbook.backends"}
ENGINE_MAY_USE_FROM_CONTRACT = {"tinker_cookbook.tinker.types", "tinker_cookbook.tinker.errors"}
ENGINE_BENCHES = {"bench.bench_training", "bench.bench_sampling", "bench.bench_sampler_lora", "bench.bench_multi_lora",
                  "bench.gpu_check", "bench.peer_common"}
"""The benches that time the engine's parts directly (a model load, a training pass, a decode step), and the peer
benches' shared module, which hands a peer (TRL) the model the engine loads, so that both train the same weights."""


def layer_of(module: str) -> str | None:
    if module in BASE_MODULES or module.startswith(("tinker_cookbook.base.", "tinker_cookbook.exceptions.",
                                                      "tinker_cookbook.perf_env.")) or module == "tinker_cookbook.base":
        return "base"
    if module in WIRING_MODULES or any(module.startswith(m + ".") for m in WIRING_MODULES):
        return "wiring"
    if module == "tinker_cookbook.tinker" or module.startswith("tinker_cookbook.tinker."):
        return "contract"
    if module == "tinker_cookbook.engine" or module.startswith("tinker_cookbook.engine."):
        return "engine"
    if module.startswith(("tinker_cookbook.", "recipes")) or module == "recipes":
        return "cookbook"
    if module == "bench" or module.startswith("bench."):
        return "bench"
    return None  # stdlib or third party


def is_private_contract(module: str) -> bool:
    """A private module of the contract (``tinker_cookbook.tinker._remote``) or a private name of one of its
    modules (``tinker_cookbook.tinker.backend._registered``)."""
    parts = module.split(".")
    return parts[:2] == ["tinker_cookbook", "tinker"] and any(
        p.startswith("_") and not p.startswith("__") for p in parts[2:])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the file; ``from pkg import name`` yields ``pkg.name``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from tinker_cookbook import tinker" imports the sub-package tinker_cookbook.tinker
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
            found.append((node.lineno, base))
    return found


def violation(importer: str, imported: str) -> str | None:
    src, dst = layer_of(importer), layer_of(imported)
    if dst is None or src is None:
        return None
    if is_private_contract(imported) and src not in ("contract", "wiring"):
        return "private modules of the contract are its own and the wiring module's; use the public API"
    if dst == "bench" and src != "bench":
        return "bench scripts use the package; nothing in it imports them"
    if src == "bench" and dst == "engine" and importer not in ENGINE_BENCHES:
        return ("a bench that is not one of ENGINE_BENCHES measures through the public API; list it there if "
                "it times the engine's parts")
    if src == "base" and dst != "base":
        return "the base layer imports only itself"
    if src == "contract" and dst in ("engine", "cookbook", "wiring"):
        return "the API contract imports neither the engine nor the cookbook; it reaches backends through Backend"
    if src == "engine" and dst in ("cookbook", "wiring"):
        return "the engine must not import cookbook or wiring modules"
    if src == "wiring" and dst == "cookbook":
        return "the wiring module imports only the engine, the contract and base"
    if src == "engine" and dst == "contract" and not any(
        imported == m or imported.startswith(m + ".") for m in ENGINE_MAY_USE_FROM_CONTRACT
    ) and imported != "tinker_cookbook.tinker":
        return "the engine may use only the contract's types and errors"
    if src == "cookbook" and dst == "engine":
        return "the cookbook uses only the public API (tinker_cookbook.tinker), never the engine"
    return None


def source_files() -> list[Path]:
    return sorted([*REPO.glob("tinker_cookbook/**/*.py"), *REPO.glob("recipes/**/*.py"), *REPO.glob("bench/**/*.py")])


def find_violations() -> list[str]:
    problems = []
    for path in source_files():
        importer = module_name(path)
        for line, imported in imported_modules(path, importer):
            why = violation(importer, imported)
            if why:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {imported}: {why}")
    return sorted(set(problems))


def test_source_files_are_found():
    names = {module_name(p) for p in source_files()}
    assert {"tinker_cookbook.engine.training.session", "tinker_cookbook.tinker.types", "recipes.sl_basic",
            "bench.bench_rl"} <= names
    assert ENGINE_BENCHES <= names, "ENGINE_BENCHES names a bench that no longer exists"


def test_imports_follow_the_layering_rule():
    problems = find_violations()
    assert not problems, "layering violations:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("tinker_cookbook.supervised.train", "tinker_cookbook.engine.models", False),
        ("tinker_cookbook.supervised.train", "tinker_cookbook.tinker.types", True),
        ("recipes.sl_basic", "tinker_cookbook.engine", False),
        ("tinker_cookbook.engine.models", "tinker_cookbook.tokenizer_utils", False),
        ("tinker_cookbook.engine.models", "tinker_cookbook.base.assets", True),
        ("tinker_cookbook.engine.backend", "tinker_cookbook.tinker.errors.BadRequestError", True),
        ("tinker_cookbook.engine.backend", "tinker_cookbook.tinker.training_client", False),
        ("tinker_cookbook.tinker.rest_client", "tinker_cookbook.engine.store.checkpoint_store", False),
        ("tinker_cookbook.tinker.service_client", "tinker_cookbook.engine.backend", False),
        ("tinker_cookbook.tinker.backend", "tinker_cookbook.backends", False),
        ("tinker_cookbook.backends", "tinker_cookbook.engine.backend", True),
        ("tinker_cookbook.backends", "tinker_cookbook.tinker._remote", True),
        ("tinker_cookbook.backends", "tinker_cookbook.supervised.train", False),
        ("tinker_cookbook.server.tinker_api", "tinker_cookbook.engine.backend", False),
        ("tinker_cookbook.server.tinker_api", "tinker_cookbook.backends", True),
        ("tinker_cookbook.engine.backend", "tinker_cookbook.backends", False),
        ("tinker_cookbook.base.tokenizers", "tinker_cookbook.tinker.types", False),
        ("tinker_cookbook.tinker.types", "tinker_cookbook.renderers", False),
        ("tinker_cookbook.server.openai_api", "tinker_cookbook.engine.backend", False),
        ("tinker_cookbook.server.tinker_api", "tinker_cookbook.engine.sampling.sampler", False),
        ("tinker_cookbook.server.app", "tinker_cookbook.tinker.backend", True),
        ("tinker_cookbook.server.openai_api", "tinker_cookbook.renderers", True),
        ("tinker_cookbook.server.openai_api", "tinker_cookbook.tokenizer_utils", True),
        # private contract modules and names: the contract and the wiring module only
        ("tinker_cookbook.server.app", "tinker_cookbook.tinker._remote", False),
        ("tinker_cookbook.server.tinker_api", "tinker_cookbook.tinker.backend._registered", False),
        ("recipes.sl_basic", "tinker_cookbook.tinker._remote.RemoteBackend", False),
        ("bench.bench_server", "tinker_cookbook.tinker._remote", False),
        ("tinker_cookbook.tinker.service_client", "tinker_cookbook.tinker._remote", True),
        ("tinker_cookbook.server.app", "tinker_cookbook.tinker.__version__", True),
        # bench: a cookbook-level user; the engine benches may time the engine
        ("bench.bench_training", "tinker_cookbook.engine.training", True),
        ("bench.gpu_check", "tinker_cookbook.engine.models", True),
        ("bench.bench_rl", "tinker_cookbook.engine.backend", False),
        ("bench.bench_server", "tinker_cookbook.engine.sampling.sampler", False),
        ("bench.bench_server", "tinker_cookbook.tinker.types", True),
        ("bench.bench_server", "tinker_cookbook.renderers", True),
        ("bench.bench_rl", "tinker_cookbook.backends", True),
        ("tinker_cookbook.engine.backend", "bench.bench_training", False),
        ("recipes.sl_basic", "bench.bench_rl", False),
    ],
)
def test_the_rule_itself(importer, imported, allowed):
    assert (violation(importer, imported) is None) == allowed


def test_importing_the_api_loads_no_engine():
    """``from tinker_cookbook import tinker`` (or the server) stays light: the engine loads when the first client or
    server is created."""
    code = (
        "import sys; from tinker_cookbook import tinker; from tinker_cookbook import cli, renderers, server; "
        "loaded = sorted(m for m in sys.modules if m.startswith('tinker_cookbook.engine')); print(loaded)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"


def test_the_contract_names_the_wiring_module_it_loads():
    """The one dynamic import of the contract (``backend.PROVIDER_MODULE``) is the wiring module, and that module
    registers the factories: creating a client needs nothing else."""
    from tinker_cookbook.tinker import backend

    assert backend.PROVIDER_MODULE in WIRING_MODULES
    code = ("from tinker_cookbook.tinker import backend; backend._registered(); "
            "print(backend._factories is not None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "True"
