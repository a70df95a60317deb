"""``publish``: push an exported folder (merged model or adapter, with its model card) to the Hugging Face Hub.

The token comes from where ``huggingface_hub`` looks (``HF_TOKEN``, then the file ``hf auth login`` writes). Where
the hub cannot be reached (offline mode, or no answer) it stops before any upload with a WeightsError that says
what it would have pushed. This is not ``tinker-cookbook checkpoint publish``, which only marks a checkpoint of the
store public.
"""

from __future__ import annotations

import re
from pathlib import Path

from tinker_cookbook.base.hub import hub_is_reachable, hub_offline
from tinker_cookbook.exceptions import ConfigurationError, WeightsError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def _size(files: list[Path]) -> str:
    total = sum(f.stat().st_size for f in files)
    return f"{total / 1e6:.1f} MB" if total >= 1e5 else f"{total} B"


def planned_upload(folder: Path, repo_id: str, private: bool) -> str:
    """One line: what would be pushed where."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    names = ", ".join(p.relative_to(folder).as_posix() for p in files)
    visibility = "private" if private else "public"
    return f"{len(files)} files ({_size(files)}) from {folder} to https://huggingface.co/{repo_id} ({visibility}): {names}"


def publish(model_path: str, repo_id: str, private: bool = False, token: str | None = None,
            commit_message: str = "Upload fine-tuned model (tinker_cookbook.weights)") -> str:
    """Upload the folder ``model_path`` to the model repo ``repo_id`` (created if missing); returns its URL."""
    folder = Path(model_path).expanduser()
    if not _REPO_ID.match(repo_id):
        raise ConfigurationError(f"repo={repo_id!r} is not a Hub repo id; write it as USER/NAME or ORG/NAME")
    if not folder.is_dir() or not any(folder.iterdir()):
        raise ConfigurationError(f"model_path={model_path!r} is not a folder with files; pass the output of "
                                 "`tinker-cookbook weights merge` or `weights adapter`")
    plan = planned_upload(folder, repo_id, private)
    if not hub_is_reachable():
        why = "offline mode is on (HF_HUB_OFFLINE)" if hub_offline() else "it does not answer"
        raise WeightsError(f"the Hugging Face Hub cannot be reached ({why}); nothing was pushed. Would push {plan}")
    from huggingface_hub import HfApi, get_token

    token = token or get_token()
    if not token:
        raise WeightsError(f"no Hugging Face token: set HF_TOKEN or run `hf auth login`; nothing was pushed. "
                           f"Would push {plan}")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=commit_message)
    return f"https://huggingface.co/{repo_id}"
