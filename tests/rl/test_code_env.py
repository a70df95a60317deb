"""Code RL: replies are graded by their unit tests in the sandbox; bad code ends its episode with a reason and a
reward of at most 0, and the recipe runs end to end (tiny random model) under both module spellings."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl.code_env import CodeEnv, CodeRLDatasetBuilder, _deepcoder_tests
from tinker_cookbook.rl.code_grading import extract_code, run_tests
from tinker_cookbook.rl.code_problems import OFFLINE_PROBLEMS, CodeProblem, split_offline
from tinker_cookbook.sandbox import Outcome, Sandbox, SandboxConfig

REPO = Path(__file__).resolve().parents[2]
SQUARE = next(p for p in OFFLINE_PROBLEMS if p.name == "square")
ECHO_SUM = CodeProblem("sum", "Print the sum of the numbers.", (), (("1 2 3\n", "6\n"), ("10 -1", "9")))


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxConfig(wall_s=5.0, cpu_s=1, memory_mb=256, max_output_bytes=4096))


def grade(sandbox: Sandbox, problem: CodeProblem, code: str | None):
    return asyncio.run(run_tests(sandbox, problem, code))


def test_extract_code_takes_the_last_fenced_block():
    text = "Here:\n```python\nx = 1\n```\nor better\n```\ndef f():\n    return 2\n```\n"
    assert extract_code(text) == "def f():\n    return 2\n"
    assert extract_code("```py\nprint(1)\n```") == "print(1)\n"
    assert extract_code("def f(): return 1") is None
    assert extract_code("```python\ndef f(): return 1") is None  # cut off before the closing fence


@pytest.mark.parametrize("code, passed, outcome", [
    ("def square(x):\n    return x * x\n", 3, Outcome.OK),
    ("def square(x):\n    return x * 2\n", 1, Outcome.OK),  # right only for square(0) == 0
    ("def square(x):\n    while True:\n        pass\n", 0, Outcome.TIMEOUT),
    ("def square(x):\n    return x ** 2\nimport os\nos._exit(0)\n", 0, Outcome.CRASH),
    ("def square(x) return x\n", 0, Outcome.CRASH),
    ("import sys\nwhile True:\n    print('spam' * 1000)\n", 0, Outcome.OUTPUT_LIMIT),
    ("hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))\n", 0, Outcome.MEMORY),
])
def test_tests_passed_and_outcomes(sandbox, code, passed, outcome):
    report = grade(sandbox, SQUARE, code)
    assert (report.passed, report.total, report.outcome) == (passed, 3, outcome), report
    assert report.reason


def test_printing_the_report_marker_does_not_pass_the_tests(sandbox):
    code = "print('__tests_0000000000000000__ {\"passed\": 3, \"error\": null}')\ndef square(x):\n    return 0\n"
    assert grade(sandbox, SQUARE, code).passed == 1  # only square(0) == 0


def test_stdin_problems_compare_printed_tokens(sandbox):
    report = grade(sandbox, ECHO_SUM, "print(sum(map(int, input().split())))")
    assert (report.passed, report.total, report.outcome) == (2, 2, Outcome.OK)
    assert grade(sandbox, ECHO_SUM, "print(0)").passed == 0


def test_no_code_block_runs_nothing(sandbox):
    report = grade(sandbox, SQUARE, None)
    assert report.outcome is None and report.passed == 0 and "code block" in report.reason


def test_every_offline_problem_is_solvable_and_not_by_a_constant():
    answers = {
        "square": "x * x", "double": "2 * x", "is_even": "n % 2 == 0", "negate": "-x", "max_of_two": "max(a, b)",
        "min_of_two": "min(a, b)", "first": "items[0]", "last": "items[-1]", "length": "len(s)",
        "to_upper": "s.upper()", "to_lower": "s.lower()", "reverse_string": "s[::-1]", "sum_list": "sum(nums)",
        "count_items": "len(items)", "is_positive": "n > 0", "abs_value": "abs(x)", "concat": "a + b",
        "increment": "n + 1", "decrement": "n - 1", "half": "x / 2", "cube": "x ** 3", "is_empty": "not items",
        "average": "sum(nums) / len(nums)", "max_list": "max(nums)", "min_list": "min(nums)",
        "sort_list": "sorted(nums)", "starts_with_a": "s.startswith('a')", "repeat_string": "s * n",
        "is_zero": "n == 0", "remainder": "a % b", "multiply": "a * b", "subtract": "a - b", "power": "a ** b",
        "is_divisible": "a % b == 0", "greet": "'Hello, ' + name", "count_char": "s.count(c)",
        "unique_sorted": "sorted(set(nums))", "squares": "[i * i for i in range(n)]",
        "sum_to": "n * (n + 1) // 2", "is_palindrome": "s == s[::-1]", "first_char": "s[0]",
        "word_count": "len(s.split())", "contains": "x in items", "evens": "[n for n in nums if n % 2 == 0]",
        "join_words": "' '.join(words)", "celsius_to_fahrenheit": "c * 9 / 5 + 32", "is_odd": "n % 2 == 1",
        "last_char": "s[-1]", "sum_of_squares": "sum(n * n for n in nums)", "triple": "3 * x",
        "add": "a + b", "is_adult": "age >= 18",
    }
    assert sorted(answers) == sorted(p.name for p in OFFLINE_PROBLEMS)

    # Our own answers and tests: trusted code, checked in this process (the sandbox is tested elsewhere).
    for problem in OFFLINE_PROBLEMS:
        signature = problem.prompt.split("`")[1]
        for answer, should_pass in ((answers[problem.name], True), ("None", False)):
            namespace: dict = {}
            exec(f"def {signature}:\n    return {answer}\n", namespace)
            for test in problem.tests:
                try:
                    exec(test, namespace)
                    passed = True
                except AssertionError:
                    passed = False
                except TypeError:  # None compared with a number
                    passed = False
                assert passed == should_pass, (problem.name, answer, test)
    train, test = split_offline()
    assert len(train) + len(test) == len(OFFLINE_PROBLEMS) and not {p.name for p in train} & {p.name for p in test}


def test_env_step_rewards_and_logs_the_sandbox_reason(chatml, sandbox):
    def step(reply: str):
        env = CodeEnv(SQUARE, chatml, sandbox, format_coef=0.1)
        tokens = chatml.tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
        return asyncio.run(env.step(tokens))

    good = step("```python\ndef square(x):\n    return x * x\n```")
    assert good.reward == pytest.approx(1.0) and good.metrics["correct"] == 1.0 and good.metrics["ok"] == 1.0
    looping = step("```python\ndef square(x):\n    while True: pass\n```")
    assert looping.reward == pytest.approx(0.0) and looping.metrics["timeout"] == 1.0
    assert str(looping.logs["sandbox"]).startswith("timeout: ")
    prose = step("The square of x is x times x.")
    # No code: nothing passes, and the format penalty applies: 0 + 0.1 * (0 - 1).
    assert prose.reward == pytest.approx(-0.1) and prose.metrics["no_code"] == 1.0


def test_deepcoder_rows_keep_only_stdin_tests():
    raw = json.dumps([{"input": "1\n", "output": "2\n", "testtype": "stdin_stdout"},
                      {"input": "f(1)", "output": "2", "testtype": "functional"}])
    assert _deepcoder_tests(raw) == (("1\n", "2\n"),)
    assert _deepcoder_tests({"inputs": ["a"], "outputs": ["b"]}) == (("a", "b"),)


def test_the_hub_source_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    builder = CodeRLDatasetBuilder(batch_size=2, group_size=2, model_name_for_tokenizer="x", renderer_name="x",
                                   source="deepcoder")
    with pytest.raises(ConfigurationError, match="source=offline"):
        builder.problems()


def test_the_recipe_runs_two_steps(tmp_path):
    """Under the docs' spelling (the same file as ``recipes.code_rl.train``: tests/recipes/test_module_spellings.py)."""
    log_path = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tinker_cookbook.recipes.code_rl.train", "model_name=tinker-cookbook/tiny-smollm2", "max_steps=2", "lora_rank=4",
         "batch_size=2", "group_size=2", "test_group_size=1", "max_tokens=16", f"log_path={log_path}",
         "behavior_if_log_dir_exists=delete"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "env/all/pass_fraction" in r] == [0, 1]
    assert "test/env/all/correct" in rows[0] and "env/all/timeout" in rows[0]
