"""Grade generated code by running its unit tests in the sandbox (``tinker_cookbook.sandbox``).

One sandbox run per reply: ``main.py`` is a small harness that loads ``solution.py`` (the reply's code), runs every
test (an assertion, or a stdin/stdout pair) catching each failure, and prints one marked line with the count
passed. A run that does not end ``ok`` (it looped, ran out of memory, printed too much, crashed) passes no test, and
the report says why.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from tinker_cookbook.rl.code_problems import CodeProblem
from tinker_cookbook.sandbox import Outcome, Sandbox

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

_HARNESS = '''
import contextlib, io, json, sys

def _load(namespace, stdin=""):
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)

def _main():
    tests = json.load(open("tests.json"))
    passed, error = 0, None
    namespace = {"__name__": "__main__" if not tests["asserts"] else "solution"}
    if tests["asserts"]:
        try:
            _load(namespace)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
        for test in tests["asserts"] if error is None else []:
            try:
                exec(test, dict(namespace))
                passed += 1
            except BaseException:
                pass
    for stdin, expected in tests["io"]:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                _load({"__name__": "__main__"}, stdin)
        except SystemExit:
            pass
        except BaseException as exc:
            error = error or f"{type(exc).__name__}: {exc}"
            continue
        passed += out.getvalue().split() == expected.split()
    sys.stdout = sys.__stdout__
    print()
    print(MARKER + json.dumps({"passed": passed, "error": error}))

_main()
'''


def extract_code(text: str) -> str | None:
    """The last fenced code block of ``text`` (```python, ```py or bare ```), or None when there is none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None


@dataclass(frozen=True)
class TestReport:
    passed: int
    total: int
    outcome: Outcome | None
    """How the sandbox run ended (None: nothing was run, the reply had no code)."""
    reason: str

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def harness_files(problem: CodeProblem, code: str, marker: str) -> tuple[str, dict[str, str]]:
    """``main.py``'s text and the other files of a run that tests ``code`` on ``problem``."""
    tests = {"asserts": list(problem.tests), "io": [list(pair) for pair in problem.io_tests]}
    main = f"MARKER = {marker!r}\n{_HARNESS}"
    return main, {"solution.py": code, "tests.json": json.dumps(tests)}


async def run_tests(sandbox: Sandbox, problem: CodeProblem, code: str | None) -> TestReport:
    """Run ``problem``'s tests on ``code`` in ``sandbox``."""
    total = len(problem.tests) + len(problem.io_tests)
    if code is None:
        return TestReport(0, total, None, "no ```python code block in the reply")
    # A fresh marker per run, so text that the solution prints cannot pass for the harness's report by accident.
    marker = f"__tests_{secrets.token_hex(8)}__ "
    main, files = harness_files(problem, code, marker)
    result = await sandbox.run(main, files=files)
    if result.outcome != Outcome.OK:
        return TestReport(0, total, result.outcome, result.reason)
    reports = [line[len(marker):] for line in result.stdout.splitlines() if line.startswith(marker)]
    if not reports:
        return TestReport(0, total, Outcome.CRASH, "the tests did not finish (the solution ended the process)")
    report = json.loads(reports[-1])
    if report["error"] is not None and report["passed"] == 0:
        # The harness caught it, so the run itself ended ok; report the failure the way the sandbox would have.
        outcome = Outcome.MEMORY if report["error"].startswith("MemoryError") else Outcome.CRASH
        return TestReport(0, total, outcome, f"the solution raised {report['error'][:300]}")
    return TestReport(int(report["passed"]), total, Outcome.OK, f"{report['passed']}/{total} tests passed")
