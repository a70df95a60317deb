"""The clock-cycles demo: each way submits and awaits requests in the order it claims, and the demo runs."""

from __future__ import annotations

import asyncio
import random

import pytest

from recipes import clock_cycles
from tinker_cookbook import run_core, tinker


class _Future:
    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    async def result_async(self, timeout=None):
        self.events.append(f"await {self.name}")


class RecordingClient:
    """Stands in for a training client: records submissions and awaits, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.n = {"fb": 0, "opt": 0}

    async def forward_backward_async(self, batch, loss_fn):
        self.n["fb"] += 1
        self.events.append(f"submit fb{self.n['fb']}")
        return _Future(self.events, f"fb{self.n['fb']}")

    async def optim_step_async(self, adam):
        self.n["opt"] += 1
        self.events.append(f"submit opt{self.n['opt']}")
        return _Future(self.events, f"opt{self.n['opt']}")


def _events(mode: str, n_steps: int = 3) -> list[str]:
    client = RecordingClient()

    async def next_batch():
        client.events.append("batch")
        return []

    asyncio.run(clock_cycles.RUNNERS[mode](client, next_batch, run_core.adam_params(1e-4), n_steps))  # type: ignore[arg-type]
    return client.events


def test_naive_waits_for_each_request_before_the_next():
    assert _events("naive", 2) == ["batch", "submit fb1", "await fb1", "submit opt1", "await opt1",
                                   "batch", "submit fb2", "await fb2", "submit opt2", "await opt2"]


def test_back_to_back_submits_both_before_waiting():
    assert _events("back_to_back", 2) == ["batch", "submit fb1", "submit opt1", "await fb1", "await opt1",
                                          "batch", "submit fb2", "submit opt2", "await fb2", "await opt2"]


def test_pipelined_submits_the_next_step_before_waiting_for_this_one():
    assert _events("pipelined", 3) == [
        "batch", "submit fb1", "submit opt1",
        "batch", "submit fb2", "submit opt2", "await fb1", "await opt1",
        "batch", "submit fb3", "submit opt3", "await fb2", "await opt2",
        "await fb3", "await opt3",
    ]


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="modes="):
        clock_cycles.Config(modes=("fast",))
    with pytest.raises(ValueError, match="client_work_s=-1"):
        clock_cycles.Config(client_work_s=-1)


def test_the_demo_times_every_way_on_the_engine(capsys):
    cfg = clock_cycles.Config(model_name="tinker-cookbook/tiny-smollm2", lora_rank=4, batch_size=2, seq_len=8,
                              n_steps=2, client_work_s=0.05)
    clock_cycles.main(cfg)
    out = capsys.readouterr().out
    assert all(f"  {mode} " in out for mode in clock_cycles.MODES) and "s/step" in out
    batch = clock_cycles.make_batch(random.Random(0), cfg, vocab_size=50)
    assert len(batch) == 2 and all(isinstance(d, tinker.Datum) and d.model_input.length == 7 for d in batch)
