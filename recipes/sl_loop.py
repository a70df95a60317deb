"""Supervised fine-tuning as one flat loop on the raw API, for people who write their own loops.

    python -m recipes.sl_loop                                   # SmolLM2-135M-Instruct on example-data, CPU
    python -m recipes.sl_loop model_name=tinker-cookbook/tiny-smollm2 max_steps=2      # smoke test, seconds
    python -m recipes.sl_loop learning_rate=3e-4 log_path=/tmp/sft-lr-sweep/lr-3e-4    # one point of an LR sweep

It does what ``tinker_cookbook.supervised.train`` does (the "Supervised Learning Training Loop" docs page) without
dataset classes, evaluator plumbing or pipelining: read a JSONL of conversations, render each with the model's
chat renderer, and train with ``forward_backward`` + ``optim_step`` at a linearly decaying learning rate. It logs
``train_mean_nll``, ``test/nll``, ``progress`` and ``learning_rate`` to ``metrics.jsonl``, saves checkpoints to
``checkpoints.jsonl``, and resumes from the last one when run again on the same ``log_path``.
"""

from __future__ import annotations

import json
import logging
import time

import chz
import numpy as np

from tinker_cookbook import checkpoint_utils, cli_utils, hyperparam_utils, renderers, tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.supervised.chat_datasets import example_conversations_path
from tinker_cookbook.supervised.types import resolve_renderer_name
from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.utils import ml_log

logger = logging.getLogger(__name__)


@chz.chz
class Config:
    """The flat supervised loop's settings."""

    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """The base model the LoRA adapter is trained on."""
    data_path: str = chz.field(default_factory=lambda: str(example_conversations_path()))
    """A JSONL file with one ``{"messages": [...]}`` conversation per line (default: the project's example data)."""
    test_size: int = 48
    """Conversations held out to measure ``test/nll``."""
    log_path: str
    """Where the run writes metrics.jsonl, checkpoints.jsonl and config.json."""
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    batch_size: int = 16
    """Conversations per step."""
    learning_rate: float | None = None
    """None: ``hyperparam_utils.get_lr(model_name)``."""
    max_length: int = 256
    """Conversations are cut to this many tokens."""
    lora_rank: int = 32
    """Rank of the LoRA adapter."""
    num_epochs: int = 1
    """Passes over the training conversations."""
    max_steps: int | None = None
    """Stop after this many steps (None: all epochs); rerun with more to go on."""
    eval_every: int = 6
    """Steps between test evaluations (0: never)."""
    save_every: int = 8
    """Steps between checkpoints (0: only at the end)."""
    seed: int = 0
    """Seed of the LoRA initialisation: reruns (and resumed runs) give the same numbers."""
    behavior_if_log_dir_exists: cli_utils.LogdirBehavior = "ask"
    """When log_path holds a run: resume it, delete it, raise, or ask (raise when stdin is not a terminal)."""


def load_conversations(path: str) -> list[list[renderers.Message]]:
    """The ``messages`` of every line of a JSONL file."""
    conversations = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise ValueError(f"{path}:{number}: expected a JSON object with a 'messages' list")  # noqa: TRY004
            conversations.append(row["messages"])
    return conversations


def make_datum(messages: list[renderers.Message], renderer: renderers.Renderer, max_length: int) -> types.Datum:
    """Tokens and weights (1 on assistant replies) -> a next-token datum whose weights sum to 1."""
    model_input, weights = renderer.build_supervised_example(messages, renderers.TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    tokens = model_input.to_ints()[:max_length]
    w = weights.tolist()[: len(tokens)]
    # Position i is trained to predict token i + 1: inputs drop the last token, targets and weights the first.
    target_weights = np.asarray(w[1:], dtype=np.float32)
    if target_weights.sum() == 0:
        raise ValueError(f"a conversation has no assistant tokens within max_length={max_length}")
    target_weights /= target_weights.sum()  # every conversation counts the same, however long its replies
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": target_weights},
    )


def mean_nll(output: types.ForwardBackwardOutput, data: list[types.Datum]) -> float:
    """-sum(w * logp) / sum(w) over the batch."""
    losses = [-np.dot(out["logprobs"].to_numpy(), d.loss_fn_inputs["weights"].to_numpy())
              for out, d in zip(output.loss_fn_outputs, data, strict=True)]
    total_weight = sum(d.loss_fn_inputs["weights"].to_numpy().sum() for d in data)
    return float(sum(losses) / total_weight)


def start_training_client(config: Config, service_client: tinker.ServiceClient,
                          resume_row: dict | None) -> tinker.TrainingClient:
    """The last checkpoint's client (weights and optimizer state), or a new LoRA."""
    if resume_row is not None:
        logger.info("resuming from %s after step %d", resume_row["state_path"], resume_row["step"])
        return service_client.create_training_client_from_state_with_optimizer(resume_row["state_path"])
    return service_client.create_lora_training_client(base_model=config.model_name, rank=config.lora_rank,
                                                      seed=config.seed)


def main(config: Config) -> None:
    tokenizer = get_tokenizer(config.model_name)
    renderer = renderers.get_renderer(resolve_renderer_name(config.model_name, config.renderer_name), tokenizer)
    conversations = load_conversations(config.data_path)
    np.random.default_rng(0).shuffle(conversations)
    test_data = [make_datum(c, renderer, config.max_length) for c in conversations[: config.test_size]]
    train_conversations = conversations[config.test_size :]
    n_batches = len(train_conversations) // config.batch_size
    total_steps = n_batches * config.num_epochs
    end_step = min(total_steps, config.max_steps or total_steps)
    learning_rate = config.learning_rate or hyperparam_utils.get_lr(config.model_name)

    # The same resume rules as the shared loops: refuse another run's log dir, drop rows past the last checkpoint.
    resume = checkpoint_utils.resume_point(config.log_path, config.behavior_if_log_dir_exists, config,
                                           identity_keys=("model_name", "data_path", "lora_rank", "renderer_name"))
    start_step = 0 if resume.row is None else int(resume.row["step"])
    if not resume.begin(start_step, end_step):
        return
    service_client = tinker.ServiceClient()
    training_client = start_training_client(config, service_client, resume.row)
    # config.json records the learning rate actually used (the sweep page reads it back).
    ml_logger = ml_log.setup_logging(config.log_path, config=chz.replace(config, learning_rate=learning_rate))
    logger.info("%d train conversations, %d batches x %d epochs; steps %d..%d", len(train_conversations),
                n_batches, config.num_epochs, start_step, end_step - 1)

    finished = end_step == total_steps
    for step in range(start_step, end_step):
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        last_of_run = finished and step == end_step - 1
        if config.save_every and step > start_step and step % config.save_every == 0:
            checkpoint_utils.save_checkpoint(training_client, f"{step:06d}", config.log_path,
                                             {"step": step, "epoch": step // n_batches, "batch": step % n_batches})
        if config.eval_every and step % config.eval_every == 0 and not last_of_run:
            metrics["test/nll"] = mean_nll(training_client.forward(test_data, "cross_entropy").result(), test_data)

        # Each epoch visits the conversations in its own (reproducible) order.
        epoch, batch = divmod(step, n_batches)
        order = np.random.default_rng(epoch).permutation(len(train_conversations))
        rows = order[batch * config.batch_size : (batch + 1) * config.batch_size]
        data = [make_datum(train_conversations[i], renderer, config.max_length) for i in rows]

        lr = learning_rate * (1 - step / total_steps)
        # Queue both requests before waiting: they run back to back on the engine.
        fwd_bwd_future = training_client.forward_backward(data, "cross_entropy")
        optim_future = training_client.optim_step(types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8))
        fwd_bwd = fwd_bwd_future.result()
        optim_future.result()

        metrics.update({
            "train_mean_nll": mean_nll(fwd_bwd, data),
            "learning_rate": lr,
            "progress": (step + 1) / total_steps,
            "epoch": epoch,
            "num_sequences": len(data),
            "num_tokens": sum(d.model_input.length for d in data),
            "time/total": time.perf_counter() - start,
        })
        if last_of_run:  # the last row of a finished run carries the final model's test loss
            metrics["test/nll"] = mean_nll(training_client.forward(test_data, "cross_entropy").result(), test_data)
        ml_logger.log_metrics(metrics, step=step)

    checkpoint_utils.save_checkpoint(
        training_client, "final" if finished else f"{end_step:06d}", config.log_path,
        {"step": end_step, "epoch": end_step // n_batches, "batch": end_step % n_batches,
         **({"final": True} if finished else {})},
    )
    ml_logger.close()


if __name__ == "__main__":
    run_recipe(main, name="sl_loop")
