"""A local sandbox for untrusted Python: resource limits, a throwaway directory, namespaces, bubblewrap or Landlock.

``Sandbox(SandboxConfig(...)).run(code)`` (async) returns a ``SandboxResult`` whose ``outcome`` is one of
``Outcome`` (ok, timeout, memory, output_limit, crash) with a reason. docs/code-rl.md says what it guards against.
"""

from tinker_cookbook.sandbox.isolation import Isolation, isolation_for
from tinker_cookbook.sandbox.runner import Outcome, Sandbox, SandboxConfig, SandboxResult

__all__ = ["Isolation", "Outcome", "Sandbox", "SandboxConfig", "SandboxResult", "isolation_for"]
