"""An env written against the official logtree API runs in the RL loop, and what it logs shows in the HTML reports
(training rollouts in ``train.html``, the test set's in ``eval.html``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import chz

from tinker_cookbook import renderers, tinker
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.utils import logtree
from tinker_cookbook.utils.logtree_formatters import ConversationFormatter

MODEL = "tinker-cookbook/tiny-smollm2"


class EchoEnv(Env):
    """One turn; reward 1 for a reply of at most 3 tokens. Logs the way official envs do."""

    def __init__(self, renderer: renderers.Renderer, question: str) -> None:
        self.renderer, self.question = renderer, question

    async def initial_observation(self):
        convo = [{"role": "user", "content": self.question}]
        with logtree.scope_header("Prompt"):
            logtree.log_formatter(ConversationFormatter(messages=convo))
        return self.renderer.build_generation_prompt(convo), self.renderer.get_stop_sequences()

    async def step(self, action):
        message, _ = self.renderer.parse_response(action)
        reward = float(len(action) <= 3)
        with logtree.scope_header("Policy Response"):
            logtree.log_formatter(ConversationFormatter(messages=[message]))
        with logtree.scope_header("Reward"):
            logtree.table_from_dict({"question": self.question, "short_reply": reward}, caption="echo-env grading")
        return StepResult(reward, True, tinker.ModelInput.empty(), self.renderer.get_stop_sequences())


class EchoGroup(EnvGroupBuilder):
    def __init__(self, renderer: renderers.Renderer, question: str) -> None:
        self.renderer, self.question = renderer, question

    async def make_envs(self):
        return [EchoEnv(self.renderer, self.question) for _ in range(2)]

    async def compute_group_rewards(self, trajectory_group, env_group):
        logtree.log_text(f"echo-group compared {len(trajectory_group)} replies")
        return [(0.0, {}) for _ in trajectory_group]


class EchoDataset(RLDataset):
    def __init__(self, renderer: renderers.Renderer, questions: Sequence[str]) -> None:
        self.renderer, self.questions = renderer, list(questions)

    def get_batch(self, index: int):
        return [EchoGroup(self.renderer, self.questions[index])] if index < len(self.questions) else []

    def __len__(self) -> int:
        return len(self.questions)


@chz.chz
class EchoDatasetBuilder(RLDatasetBuilder):
    async def __call__(self):
        renderer = renderers.get_renderer("chatml", get_tokenizer(MODEL))
        return EchoDataset(renderer, ["train-question-A", "train-question-B"]), EchoDataset(renderer, ["held-out-Q"])


def test_official_logtree_env_shows_in_the_loop_reports(tmp_path):
    cfg = train.Config(learning_rate=1e-3, dataset_builder=EchoDatasetBuilder(), model_name=MODEL,
                       renderer_name="chatml", max_tokens=4, log_path=str(tmp_path / "run"), lora_rank=4,
                       eval_every=1, save_every=0, max_steps=1, behavior_if_log_dir_exists="delete")
    asyncio.run(train.main(cfg))
    iteration = Path(cfg.log_path) / "iteration_000000"
    train_html = (iteration / "train.html").read_text()
    # The env's own sections, for each of the group's two rollouts, inside the loop's transcript.
    assert train_html.count("echo-env grading") == 2 and train_html.count(">Policy Response<") == 2
    assert "train-question-A" in train_html and ".lt-conversation {" in train_html
    assert "echo-group compared 2 replies" in train_html
    assert "Rollout 1: total reward" in train_html  # the loop's own transcript is on the same page
    eval_html = (iteration / "eval.html").read_text()
    assert "Evaluator test" in eval_html and "held-out-Q" in eval_html and "echo-env grading" in eval_html
    # Outside the reports the env logs nowhere (no trace is active): nothing leaked into the loop's own logs.
    assert not logtree.logging_enabled()
