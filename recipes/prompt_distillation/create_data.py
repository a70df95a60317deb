"""Prompt distillation, step 1: a teacher (the model WITH a long system prompt) labels sentences; the data keeps
the sentences WITHOUT the prompt, so that a student trained on it (``.train``) behaves as if it had the prompt.

    python -m recipes.prompt_distillation.create_data            # SmolLM2-135M-Instruct teacher, offline, ~1 min
    python -m recipes.prompt_distillation.create_data output_file=/tmp/tinker-datasets/prompt_distillation_lang.jsonl
    python -m recipes.prompt_distillation.create_data model_name=Qwen/Qwen3-30B-A3B temperature=0.7 samples_per_input=4

The docs' spelling, ``python -m tinker_cookbook.recipes.prompt_distillation.create_data``, runs this same file.

The behaviour is the docs' example (``task``): reply with only the two-letter code of the sentence's language (``LABELS``;
``ot`` for anything else, code and bare numbers included). The teacher's prompt is a long system message with the
rules plus one solved example per label (small models follow examples far better than rules alone: SmolLM2-135M
with the rules alone never replied with just a code). The sentences are embedded below (``SENTENCES``, ten
languages plus ``ot``); every fourth of each language is held out (``split``) and never labelled here: ``.train``
measures on them how often the student follows the behaviour. ``target=label`` (default) keeps the label the teacher
replied with and drops replies that do not start with one (the teacher is a small model: it does not always follow
its prompt); ``target=raw`` keeps the teacher's reply as it is, as in the docs' formula (r_i = f_T([P, q_i])).
Rows are ``{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}``, the format of every SFT recipe.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Literal

import chz

from recipes.prompt_distillation.task import (
    DEFAULT_MODEL,
    default_output_file,
    follows,
    reply_label,
    split,
    teacher_messages,
)
from tinker_cookbook import renderers, tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.supervised.types import resolve_renderer_name
from tinker_cookbook.tokenizer_utils import get_tokenizer

logger = logging.getLogger(__name__)

@chz.chz
class Config:
    """Teacher sampling settings."""

    model_name: str = DEFAULT_MODEL
    """The teacher: this base model, prompted with TEACHER_PROMPT."""
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    output_file: str = chz.field(default_factory=default_output_file)
    """Where the JSONL of (sentence without the prompt -> teacher reply) rows is written."""
    target: Literal["label", "raw"] = "label"
    """label: the label the teacher replied with (replies without one are dropped); raw: the whole reply."""
    temperature: float = 0.0
    """Teacher sampling temperature (0: greedy, one reply per input whatever samples_per_input says)."""
    samples_per_input: int = 1
    """Teacher replies per sentence (with temperature > 0 they differ)."""
    max_tokens: int = 16
    """Longest teacher reply; a label needs two or three tokens."""
    max_inputs: int | None = None
    """Label only the first this many training sentences (None: all of them); for quick trials."""


async def teacher_replies(config: Config, sentences: list[str]) -> list[list[str]]:
    """``samples_per_input`` teacher replies per sentence, all requested at once (the sampler batches them)."""
    name = resolve_renderer_name(config.model_name, config.renderer_name)
    renderer = renderers.get_renderer(name, get_tokenizer(config.model_name), model_name=config.model_name)
    client = tinker.ServiceClient().create_sampling_client(base_model=config.model_name)
    n = 1 if config.temperature == 0 else config.samples_per_input
    params = tinker.SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature,
                                   stop=renderer.get_stop_sequences())

    async def sample(sentence: str) -> list[str]:
        prompt = renderer.build_generation_prompt(teacher_messages(sentence))
        response = await client.sample_async(prompt=prompt, num_samples=n, sampling_params=params)
        return [renderers.get_text_content(renderer.parse_response(seq.tokens)[0]) for seq in response.sequences]

    return list(await asyncio.gather(*(sample(s) for s in sentences)))


def main(config: Config) -> None:
    if config.samples_per_input < 1:
        raise ConfigurationError(f"samples_per_input={config.samples_per_input} must be at least 1")
    pairs = split("train")[: config.max_inputs]
    replies = asyncio.run(teacher_replies(config, [s for s, _ in pairs]))
    rows, n_replies, n_follow, n_correct = [], 0, 0, 0
    for (sentence, language), sentence_replies in zip(pairs, replies, strict=True):
        for reply in sentence_replies:
            label = reply_label(reply)
            n_replies += 1
            n_follow += follows(reply)
            n_correct += label == language
            target = reply if config.target == "raw" else label
            if target is not None:
                rows.append({"messages": [{"role": "user", "content": sentence},
                                          {"role": "assistant", "content": target}]})
    print(f"teacher: {n_follow}/{n_replies} replies are exactly a label, {n_correct}/{n_replies} name the right "
          f"language; {len(rows)} rows kept (target={config.target})")
    if not rows:
        raise ConfigurationError(
            f"the teacher {config.model_name!r} started none of its {n_replies} replies with a label, so there is "
            "nothing to distil; use a stronger teacher (model_name=...), or target=raw to keep its replies as they are")
    out = Path(config.output_file).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    run_recipe(main)
