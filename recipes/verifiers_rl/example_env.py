"""An offline ``verifiers`` environment for the adapter's example: additions of small numbers, one turn.

``load_environment(num_train, num_eval, max_operand, seed)`` returns a ``vf.SingleTurnEnv`` whose rubric gives 1
when the last integer of the reply is the sum (a plain reward function, as environments on the Environments Hub
write them). Any other chat environment loads the same way: ``vf_env_id=<installed env id>`` in the recipe.
"""

from __future__ import annotations

import random
import re
from typing import Any


def correct_sum(completion: Any, answer: str, **kwargs: Any) -> float:
    """1.0 when the last integer of the assistant's last message is ``answer``."""
    text = completion[-1]["content"] if isinstance(completion, list) and completion else str(completion)
    numbers = re.findall(r"-?\d+", text or "")
    return float(bool(numbers) and numbers[-1] == answer)


def _rows(n: int, max_operand: int, rng: random.Random) -> list[dict[str, str]]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


def load_environment(num_train: int = 256, num_eval: int = 32, max_operand: int = 9, seed: int = 0) -> Any:
    import verifiers as vf
    from datasets import Dataset

    rng = random.Random(seed)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(_rows(num_train, max_operand, rng)),
        eval_dataset=Dataset.from_list(_rows(num_eval, max_operand, rng)),
        system_prompt="Answer with the number only.",
        rubric=vf.Rubric(funcs=[correct_sum]),
    )
