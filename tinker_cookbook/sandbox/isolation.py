"""What this machine offers to confine a sandboxed process: bubblewrap, namespaces, Landlock, a pids cgroup.

Each is found once per process (``isolation_for``) by trying it, not by reading version numbers: a tool can be
installed and still refused by the kernel or a container's policy.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tinker_cookbook.exceptions import ConfigurationError

LAUNCHER = str(Path(__file__).with_name("_launch.py"))
PYTHON_FLAGS = ("-I", "-S", "-B")
"""Isolated mode (no environment variables, no user site, no script directory), no site-packages, no bytecode."""

IsolationMode = Literal["auto", "bwrap", "plain"]
_PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Isolation:
    """How runs are confined on this machine (besides the resource limits, which always apply)."""

    mode: Literal["bwrap", "plain"]
    """``bwrap``: bubblewrap's namespaces and read-only filesystem; ``plain``: our own launcher's."""
    namespaces: tuple[str, ...]
    """New namespaces of a plain run (``pid``, ``net``, and ``user`` when not root); bwrap makes its own."""
    landlock_abi: int
    """The kernel's Landlock version (0: none). 1+: plain runs cannot write outside their directory; 4+: nor use
    TCP; 6+: nor signal processes outside the sandbox."""
    cgroup_base: str | None
    """Where each run gets its own pids cgroup (None: no cgroup; fork bombs are stopped by the clock only)."""

    @property
    def landlock(self) -> bool:
        return self.landlock_abi >= 1

    @property
    def contains_escapees(self) -> bool:
        """Whether a process that leaves the run's process group (``setsid``) still dies with the run."""
        return self.mode == "bwrap" or "pid" in self.namespaces or self.cgroup_base is not None

    @property
    def blocks_network(self) -> bool:
        return self.mode == "bwrap" or "net" in self.namespaces or self.landlock_abi >= 4

    def describe(self) -> str:
        if self.mode == "bwrap":
            fs = "bubblewrap: read-only filesystem except the run's directory, private /tmp, own PID/net/user namespaces"
        else:
            fs = ("own process: " + ("writes only in the run's directory (Landlock)" if self.landlock
                                     else "NO write protection outside the run's directory")
                  + (f", own {'/'.join(self.namespaces)} namespaces" if self.namespaces else ", NO network isolation"))
        return fs + (", pids cgroup" if self.cgroup_base else ", no pids cgroup")


@functools.cache
def _probe_launcher() -> tuple[tuple[str, ...], int]:
    out = subprocess.run([sys.executable, *PYTHON_FLAGS, LAUNCHER, "--probe"], capture_output=True, text=True,
                         timeout=_PROBE_TIMEOUT_S, check=True, start_new_session=True)
    found = json.loads(out.stdout)
    return tuple(found["namespaces"]), int(found["landlock_abi"])


@functools.cache
def bwrap_path() -> str | None:
    """bubblewrap's path when it is installed and allowed to make its namespaces here, else None."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        ok = subprocess.run([path, "--ro-bind", "/", "/", "--unshare-all", "--cap-drop", "ALL", "--", "/bin/true"],
                            capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return path if ok else None


_CGROUP_CANDIDATES = (("/sys/fs/cgroup/pids", None), ("/sys/fs/cgroup", "cgroup.subtree_control"))
_cgroup_ids = itertools.count()


@functools.cache
def cgroup_base() -> str | None:
    """A cgroup directory (v1 ``pids`` hierarchy, or a v2 root with ``pids`` enabled) where we may make children."""
    for base, needs in _CGROUP_CANDIDATES:
        if needs is not None and "pids" not in _read(Path(base) / needs).split():
            continue
        try:
            probe = make_cgroup(base, 1)
        except OSError:
            continue
        remove_cgroup(probe)
        return base
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def make_cgroup(base: str, max_processes: int) -> str:
    """A new pids cgroup under ``base`` that holds at most ``max_processes`` processes."""
    path = Path(base) / f"tinker-sandbox-{os.getpid()}-{next(_cgroup_ids)}"
    path.mkdir()
    try:
        (path / "pids.max").write_text(str(max_processes))
    except OSError:
        path.rmdir()
        raise
    return str(path)


def remove_cgroup(path: str, patience_s: float = 2.0) -> None:
    """Kill what is left in the cgroup, then remove it (a cgroup with processes in it cannot be removed)."""
    deadline = time.monotonic() + patience_s
    while True:
        pids = [int(p) for p in _read(Path(path) / "cgroup.procs").split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # a zombie still being reaped; the next run uses a new cgroup anyway
            time.sleep(0.01)


def isolation_for(mode: IsolationMode) -> Isolation:
    """The isolation for ``mode`` (``auto``: bubblewrap where it works, else plain); an error names what is missing."""
    bwrap = bwrap_path() if mode in ("auto", "bwrap") else None
    if mode == "bwrap" and bwrap is None:
        raise ConfigurationError(
            "sandbox isolation='bwrap' but bubblewrap is not installed or cannot make namespaces here; install it "
            "(Debian/Ubuntu: apt-get install bubblewrap) or use isolation='plain' or 'auto'")
    namespaces, landlock_abi = _probe_launcher()
    return Isolation("bwrap" if bwrap else "plain", namespaces, landlock_abi, cgroup_base())


def interpreter_paths_under_tmp(executable: str) -> list[str]:
    """The directories of the Python running the program that lie under /tmp (a checkout and its .venv there): the
    sandbox's fresh /tmp would hide them, so they are bound back read-only. Outermost only, in a stable order."""
    found = {os.path.dirname(os.path.abspath(executable)), os.path.dirname(os.path.realpath(executable)),
             os.path.abspath(sys.prefix), os.path.abspath(sys.base_prefix)}
    under_tmp = sorted(p for p in found if p.startswith("/tmp/"))
    return [p for p in under_tmp if not any(p.startswith(q + "/") for q in under_tmp)]


def bwrap_argv(workdir: str, program: list[str]) -> list[str]:
    """bubblewrap around ``program``: everything read-only but ``workdir``, fresh /dev, /proc and /tmp (where the
    interpreter lives under /tmp, its directories stay visible, read-only), every namespace unshared (so no
    network), no capabilities, killed with its parent."""
    bwrap = bwrap_path()
    assert bwrap is not None, "bwrap_argv needs bubblewrap (isolation_for checks this)"
    # bubblewrap takes bind sources from the host's tree, so these binds work on top of the fresh /tmp.
    keep = [arg for p in interpreter_paths_under_tmp(program[0]) for arg in ("--ro-bind", p, p)]
    return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *keep,
            "--bind", workdir, workdir, "--chdir", workdir, "--unshare-all", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--", *program]
