"""The model card (``README.md``) written beside exported weights: where they came from and how to use them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tinker_cookbook.weights._adapter import Adapter

CARD_FILE = "README.md"
EXPORT_INFO_FILE = "tinker_cookbook_export.json"
"""Written into exported folders: base model, renderer and checkpoint, for the tools that read the folder later
(``export_gguf --ollama``, ``chat``)."""


def export_info(folder: Path) -> dict[str, Any]:
    """The provenance an exported folder records (empty for folders written by other tools)."""
    path = folder / EXPORT_INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_export_info(folder: Path, adapter: Adapter, base_model: str, renderer_name: str) -> None:
    info = {"base_model": base_model, "renderer_name": renderer_name, "checkpoint": adapter.source,
            "run_id": adapter.run_id}
    (folder / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")


def _last_metrics(log_path: Path) -> dict[str, Any] | None:
    """The last row of ``metrics.jsonl`` (the run's final metrics), or None."""
    path = log_path / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    return json.loads(rows[-1]) if rows else None


def _run_config(log_path: Path) -> dict[str, Any] | None:
    path = log_path / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _json_block(value: Any) -> str:
    return "```json\n" + json.dumps(value, indent=2, sort_keys=True, default=str) + "\n```"


def model_card(adapter: Adapter, base_model: str, kind: str, renderer_name: str, log_path: str | None,
               usage: str) -> str:
    """Markdown with YAML front matter; ``kind`` is ``merged`` or ``adapter``."""
    lora = {k: adapter.config.get(k) for k in ("r", "lora_alpha", "use_rslora", "target_modules")}
    front = ["---", f"base_model: {base_model}", "library_name: " + ("transformers" if kind == "merged" else "peft"),
             "tags:", "- tinker-cookbook", "- lora", "---", ""]
    what = "the base model with the LoRA adapter merged into its weights" if kind == "merged" else "a LoRA adapter"
    lines = [
        f"# Fine-tune of {base_model}", "",
        f"This folder holds {what}, exported with `tinker_cookbook.weights`.", "",
        f"- Base model: `{base_model}`",
        f"- Training run: `{adapter.run_id or 'unknown'}`",
        f"- Checkpoint: `{adapter.source}`",
        f"- Renderer (chat format): `{renderer_name}`",
        f"- LoRA: rank {lora['r']}, alpha {lora['lora_alpha']}, modules {lora['target_modules']}"
        + (" (including the unembedding)" if adapter.trains_unembed else ""),
        "", "## Usage", "", usage, "",
    ]
    config = _run_config(Path(log_path)) if log_path else None
    metrics = _last_metrics(Path(log_path)) if log_path else None
    lines += ["## Training configuration", ""]
    lines += [_json_block(config) if config else "Not recorded (pass the run's log path to include it).", ""]
    lines += ["## Final metrics", ""]
    lines += [_json_block(metrics) if metrics else "Not recorded (pass the run's log path to include them).", ""]
    return "\n".join(front + lines)
