"""The calling thread's own torch CPU thread count, leaving every other thread's alone.

``torch.set_num_threads(n)`` is process-wide: besides the calling thread's count it stores ``n`` in an atomic that
ATen copies into each thread on that thread's first parallel op (``at::init_num_threads``, run lazily once per
thread). A worker that lowered the count for a moment with it would also give ``n`` threads, for good, to any
thread (a training step's) that ran its first op meanwhile.

With ATen's OpenMP backend the count a thread uses is ``omp_get_max_threads()``, the ``nthreads-var`` ICV of the
thread's implicit task; ``omp_set_num_threads`` writes that ICV for the calling thread only (GNU libgomp, LLVM
libomp). Called on a thread after ATen's lazy init has run there, it changes that thread's count and nothing else.
MKL (attention's batched matmuls) keeps a count of its own with a thread-local setter,
``MKL_Set_Num_Threads_Local``. oneDNN (the packed matmuls) reads ``omp_get_max_threads()`` and keys its primitive
cache by the thread count, so its kernels follow.

``LocalThreads`` finds the OpenMP runtime torch loaded (and MKL's setter where torch has MKL), checks on the
calling thread that ``torch.get_num_threads()`` follows ``omp_set_num_threads``, and otherwise does nothing.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

_OPENMP_NAMES = ("libgomp", "libomp", "libiomp5")


@dataclass(frozen=True)
class _Runtime:
    set_omp: Callable[[int], object]
    set_mkl: Callable[[int], object] | None


_runtime_lock = threading.Lock()
_runtime_cache: list[_Runtime | None] = []


def _loaded_libraries() -> list[str]:
    """Shared libraries mapped into this process (Linux), else torch's own library folder."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if path.startswith("/") and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    paths += [p for p in sorted(glob.glob(os.path.join(torch_lib, "lib*"))) if p not in paths]
    return paths


def _find_runtime() -> _Runtime | None:
    """torch's OpenMP ``omp_set_num_threads`` (torch's own copy first) and MKL's thread-local setter, if any."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        logger.debug("ATen's parallel backend is not OpenMP: per-thread counts are not available")
        return None
    torch_lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    libraries = _loaded_libraries()
    openmp = [p for p in libraries if os.path.basename(p).startswith(_OPENMP_NAMES)]
    # Several OpenMP runtimes can be loaded (numpy's, a system one): ATen links the one shipped with torch.
    openmp.sort(key=lambda p: not os.path.realpath(p).startswith(torch_lib))
    set_omp = None
    for path in openmp:
        try:
            set_omp = ctypes.CDLL(path).omp_set_num_threads
            break
        except (OSError, AttributeError):
            continue
    if set_omp is None:
        logger.debug("no OpenMP runtime found among the loaded libraries: per-thread counts are not available")
        return None
    set_omp.argtypes, set_omp.restype = [ctypes.c_int], None
    set_mkl = None
    if torch.backends.mkl.is_available():
        for path in (p for p in libraries if os.path.basename(p).startswith(("libtorch_cpu", "libmkl"))):
            try:
                # The C entry point (by value); the lower-case alias is the Fortran one, which takes a pointer.
                set_mkl = ctypes.CDLL(path).MKL_Set_Num_Threads_Local
                break
            except (OSError, AttributeError):
                continue
        if set_mkl is not None:
            set_mkl.argtypes, set_mkl.restype = [ctypes.c_int], ctypes.c_int
    return _Runtime(set_omp=set_omp, set_mkl=set_mkl)


def _runtime() -> _Runtime | None:
    with _runtime_lock:
        if not _runtime_cache:
            try:
                found = _find_runtime()
            except Exception as error:  # noqa: BLE001 - an optimisation only: without it, counts stay as they are
                logger.debug("looking for the OpenMP runtime failed (%r): per-thread counts are not available", error)
                found = None
            _runtime_cache.append(found)
        return _runtime_cache[0]


class LocalThreads:
    """Sets the torch CPU thread count of the thread that created it, and of no other thread.

    Create it on the thread whose count it sets and call ``set`` only there. ``full`` is the count that thread had
    at creation (the process default, or what the caller set before starting the thread). Where the OpenMP
    runtime is not found or does not drive ``torch.get_num_threads()``, ``set`` does nothing (``active`` False).
    """

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        # Runs ATen's lazy per-thread init now, so that it cannot overwrite a count set below later.
        self.full = torch.get_num_threads()
        self.current = self.full
        self._runtime = _runtime() if self.full > 1 else None
        if self._runtime is not None and not (self._apply(1) and self._apply(self.full)):
            self._apply_unchecked(self.full)
            logger.debug("omp_set_num_threads does not change torch.get_num_threads(): per-thread counts off")
            self._runtime = None

    @property
    def active(self) -> bool:
        return self._runtime is not None

    def set(self, count: int) -> None:
        """Use ``count`` threads (clamped to ``1..full``) on this thread from now on."""
        if threading.get_ident() != self.owner:
            raise RuntimeError("LocalThreads.set called from a thread other than the one that created it")
        count = max(1, min(count, self.full))
        if count != self.current and self._runtime is not None:
            self._apply_unchecked(count)

    def _apply_unchecked(self, count: int) -> None:
        assert self._runtime is not None
        self._runtime.set_omp(count)
        if self._runtime.set_mkl is not None:
            self._runtime.set_mkl(count)
        self.current = count

    def _apply(self, count: int) -> bool:
        self._apply_unchecked(count)
        return torch.get_num_threads() == count
