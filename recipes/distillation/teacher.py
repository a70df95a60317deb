"""What the distillation recipes share offline: the default teacher and the held-out score of the teacher's task.

The default teacher is ``recipes.sl_basic``'s fine-tune of SmolLM2-135M-Instruct on the contact-card task
(``example-data/conversations.jsonl``). A recipe given no ``teacher_checkpoint`` trains it first, into
``<tmp>/tinker-examples/distillation_teacher`` (about 4-5 minutes on 2 CPU cores), or reuses the one already
there: that run resumes, and a finished run does nothing. The held-out score is the contact-card task of
``example-data/evals/contact_cards.py`` (the 48 conversations sl_basic holds out, greedy replies) through the
Inspect evaluator: ``inspect/contact_cards/card_format/accuracy`` (the reply is exactly the four card lines) and
``inspect/contact_cards/card_fields/mean`` (the fraction of the four values right).
"""

from __future__ import annotations

import logging

import chz

from tinker_cookbook import checkpoint_utils, tinker
from tinker_cookbook.base.example_data import example_data_path
from tinker_cookbook.cli_utils import default_log_path
from tinker_cookbook.eval.inspect_evaluators import InspectEvaluatorBuilder
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.utils.progress import ProgressMode

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The offline student, and the base of the default teacher."""
CARD_FORMAT = "inspect/contact_cards/card_format/accuracy"
CARD_FIELDS = "inspect/contact_cards/card_fields/mean"
HELD_OUT_METRICS = (CARD_FORMAT, CARD_FIELDS)


def teacher_log_path() -> str:
    """Where the default teacher is trained (and found again by later runs)."""
    return default_log_path("distillation_teacher")


async def default_teacher_checkpoint(model_name: str, progress: ProgressMode = "auto") -> str:
    """The ``sampler_weights`` path of ``recipes.sl_basic``'s final checkpoint of ``model_name`` on the contact-card
    data, trained now unless ``teacher_log_path()`` already holds the finished run."""
    from tinker_cookbook.supervised import train as supervised_train
    from tinker_cookbook.supervised.recipe_defaults import chat_sft

    log_path = teacher_log_path()
    # recipes.sl_basic's run on its example data: the same shared defaults, built here since recipes never import
    # one another.
    config = chz.Blueprint(supervised_train.Config).apply({
        **chat_sft({"model_name": model_name}, model_name, "example"), "recipe_name": "sl_basic",
        "model_name": model_name, "log_path": log_path, "behavior_if_log_dir_exists": "resume",
        "progress": progress}, layer_name="distillation teacher").make()
    logger.info("training the teacher (recipes.sl_basic on %s) in %s, or reusing the one there", model_name, log_path)
    await supervised_train.main(config)
    final = checkpoint_utils.get_last_checkpoint(log_path, required_key="sampler_path")
    if final is None or not final.get("final"):
        raise ConfigurationError(f"{log_path} holds no final teacher checkpoint; delete it and rerun, or pass "
                                 "teacher_checkpoint=tinker://.../sampler_weights/final of a recipes.sl_basic run")
    return str(final["sampler_path"])


def held_out_evaluator() -> InspectEvaluatorBuilder:
    """The contact-card score on sl_basic's 48 held-out conversations (greedy, at most 64 tokens)."""
    return InspectEvaluatorBuilder(tasks=[str(example_data_path("evals", "contact_cards.py"))], temperature=0.0,
                                   max_tokens=64)


@chz.chz
class TeacherScore:
    """The held-out score of a model or checkpoint (for the comparison the recipes print)."""

    model_name: str
    model_path: str | None = None

    async def __call__(self) -> dict[str, float]:
        service = tinker.ServiceClient()
        client = (service.create_sampling_client(model_path=self.model_path) if self.model_path is not None
                  else service.create_sampling_client(base_model=self.model_name))
        metrics = await held_out_evaluator()()(client)
        return {k: v for k, v in metrics.items() if k in HELD_OUT_METRICS}
