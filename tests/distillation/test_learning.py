"""On-policy distillation moves the student to the teacher: a student fine-tuned to answer one token is pulled back
to its base model (the teacher) through the RL loop, and the teacher KL collapses."""

from __future__ import annotations

import asyncio
import json

from recipes.distillation import on_policy_distillation
from tinker_cookbook import renderers, tinker
from tinker_cookbook.distillation.datasets import load_prompts
from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import get_tokenizer

TINY = "tinker-cookbook/tiny-smollm2"
TOKEN = 500


def _student_that_answers_one_token(service: tinker.ServiceClient) -> str:
    """Weights of the tiny model fine-tuned to answer the first contact-card prompt with TOKEN, repeated."""
    renderer = renderers.get_renderer("chatml", get_tokenizer(TINY))
    prompt = renderer.build_generation_prompt(load_prompts("contact_cards")[0]).to_ints()
    tokens = prompt + [TOKEN] * 12
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": tokens[1:], "weights": [0.0] * (len(prompt) - 1) + [1.0] * 12})
    client = service.create_lora_training_client(base_model=TINY, rank=4, seed=0)
    for _ in range(3):
        client.forward_backward([datum], "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=5e-2))
    return client.save_state("one-token").result().path


def test_distillation_pulls_a_drifted_student_back_to_its_teacher(tmp_path):
    student = _student_that_answers_one_token(tinker.ServiceClient())
    cli = on_policy_distillation.CLIConfig(
        model_name=TINY, teacher_model=TINY, load_checkpoint_path=student, lora_rank=4, learning_rate=1e-2,
        groups_per_batch=2, group_size=2, max_tokens=6, max_steps=3, eval_every=0, progress="off",
        log_path=str(tmp_path / "run"), behavior_if_log_dir_exists="delete")
    asyncio.run(on_policy_distillation.cli_main(cli))
    kl = [row["teacher_kl"] for row in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())]
    # The student samples TOKEN with logprob near 0 where the (near-uniform) random teacher gives it about
    # -log(49152) ≈ -10.8: the estimate starts near 10. Pushed down by the teacher term it falls to a few hundredths
    # (0.04 measured after one step); with the sign of the term flipped it would stay near 10 or rise.
    assert kl[0] > 5.0
    assert kl[-1] < 1.0
