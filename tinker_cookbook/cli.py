"""``tinker-cookbook``: inspect and manage the runs and checkpoints of the local store, and serve the engine.

The store lives in ``$TINKER_COOKBOOK_HOME`` (default ``~/.tinker_cookbook``). Examples::

    tinker-cookbook checkpoint list --run-id run-20261129-113201-ab12cd
    tinker-cookbook checkpoint info tinker://run-20261129-113201-ab12cd/sampler_weights/final
    tinker-cookbook checkpoint download tinker://run-20261129-113201-ab12cd/sampler_weights/final -o adapters
    tinker-cookbook --format json run list --limit 0
    tinker-cookbook run list -f json          # -f / --format before or after the subcommand
    tinker-cookbook serve --port 8000
    tinker-cookbook serve --host 0.0.0.0 --generate-api-key --model HuggingFaceTB/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from tinker_cookbook import __version__, perf_env
from tinker_cookbook.exceptions import ConfigurationError, TinkerCookbookError
from tinker_cookbook.tinker import RestClient, errors, types

# ---------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------


class Printer:
    """Prints either rich tables (for people) or JSON (for scripts), chosen by ``--format``."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        # Outside a terminal rich would assume 80 columns and cut tinker:// paths; be generous there.
        self.console = Console(width=None if sys.stdout.isatty() else 250, highlight=False)

    def emit(self, data: Any, table: Callable[[], Any] | str) -> None:
        """JSON of ``data``, or the rich renderable / message built by ``table``."""
        if self.fmt == "json":
            print(json.dumps(_jsonable(data), indent=2))
        else:
            self.console.print(table if isinstance(table, str) else table())


def _jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, dict):
        return {k: _jsonable(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_jsonable(v) for v in data]
    return data


def format_size(size_bytes: int | None) -> str:
    """Decimal units, as in ``342.4 MB``."""
    if size_bytes is None:
        return "-"
    size = float(size_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def format_relative(when: datetime | None, now: datetime | None = None, never: str = "-") -> str:
    """``23 minutes ago`` / ``in 2 hours``."""
    if when is None:
        return never
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    future, seconds = seconds < 0, abs(seconds)
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= length or unit == "second":
            count = int(seconds // length)
            text = f"{count} {unit}{'' if count == 1 else 's'}"
            return f"in {text}" if future else f"{text} ago"
    raise AssertionError("unreachable")


def _properties_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title)
    table.add_column("Property", style="bold")
    table.add_column("Value", overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _checkpoints_table(checkpoints: list[types.Checkpoint], title: str) -> Table:
    table = Table(title=title)
    for column in ("Checkpoint ID", "Type", "Size", "Public", "Created", "Expires", "Path"):
        table.add_column(column, overflow="fold")
    for c in checkpoints:
        table.add_row(
            c.checkpoint_id,
            c.checkpoint_type,
            format_size(c.size_bytes),
            "Yes" if c.public else "No",
            format_relative(c.time),
            format_relative(c.expires_at, never="never"),
            c.tinker_path,
        )
    return table


# ---------------------------------------------------------------------------------------------------------
# checkpoint commands
# ---------------------------------------------------------------------------------------------------------


def _parse(tinker_path: str) -> types.ParsedCheckpointTinkerPath:
    try:
        return types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    except ValueError as exc:
        raise errors.BadRequestError(str(exc)) from None


def find_checkpoint(rc: RestClient, tinker_path: str) -> types.Checkpoint:
    """The checkpoint at ``tinker_path``; NotFoundError naming the run's checkpoints when there is none."""
    parsed = _parse(tinker_path)
    listed = rc.list_checkpoints(parsed.training_run_id).result().checkpoints
    for checkpoint in listed:
        if checkpoint.checkpoint_id == parsed.checkpoint_id:
            return checkpoint
    known = ", ".join(c.checkpoint_id for c in listed) or "none"
    raise errors.NotFoundError(
        f"no checkpoint {tinker_path!r}; run {parsed.training_run_id!r} has: {known} "
        "(list them with `tinker-cookbook checkpoint list --run-id RUN`)"
    )


def checkpoint_list(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    if args.run_id is not None:
        everything = rc.list_checkpoints(args.run_id).result().checkpoints
        shown = everything if args.limit == 0 else everything[: args.limit]
        cursor = types.Cursor(offset=0, limit=len(shown), total_count=len(everything))
        response = types.CheckpointsListResponse(checkpoints=shown, cursor=cursor)
        title = f"Checkpoints of {args.run_id}"
    else:
        response = rc.list_user_checkpoints(limit=args.limit).result()
        title = "Checkpoints"
    total = response.cursor.total_count if response.cursor else len(response.checkpoints)
    title += f" ({len(response.checkpoints)} of {total})"
    out.emit(response, lambda: _checkpoints_table(response.checkpoints, title))


def checkpoint_info(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    checkpoint = find_checkpoint(rc, args.path)
    weights = rc.get_weights_info_by_tinker_path(args.path).result()
    run_id = _parse(args.path).training_run_id
    data = {
        **checkpoint.model_dump(mode="json"),
        "training_run_id": run_id,
        **weights.model_dump(mode="json"),
    }
    rows = [
        ("Checkpoint ID", checkpoint.checkpoint_id),
        ("Type", checkpoint.checkpoint_type),
        ("Tinker Path", checkpoint.tinker_path),
        ("Size", format_size(checkpoint.size_bytes)),
        ("Public", "Yes" if checkpoint.public else "No"),
        ("Created", format_relative(checkpoint.time)),
        ("Expires", format_relative(checkpoint.expires_at, never="never")),
        ("Training Run ID", run_id),
        ("Base Model", weights.base_model),
        ("LoRA Rank", str(weights.lora_rank)),
    ]
    out.emit(data, lambda: _properties_table(f"Checkpoint: {checkpoint.checkpoint_id}", rows))


def checkpoint_download(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    from tinker_cookbook.weights import download

    target = Path(download(tinker_path=args.path, output_dir=args.output, base_url=args.base_url, force=args.force))
    files = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    out.emit(
        {"tinker_path": args.path, "path": str(target), "files": files}, f"Downloaded {args.path} to {target}"
    )


def checkpoint_delete(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    # Check every path first so that a typo in the last one does not leave the first ones deleted.
    checkpoints = [find_checkpoint(rc, path) for path in args.paths]
    if not args.yes:
        listing = "\n".join(f"  {c.tinker_path}" for c in checkpoints)
        print(f"About to delete {len(checkpoints)} checkpoint(s):\n{listing}", file=sys.stderr)
        try:
            answer = input("Delete? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise errors.BadRequestError(
                "deletion not confirmed; nothing deleted (pass -y to skip the question)"
            )
    for c in checkpoints:
        rc.delete_checkpoint_from_tinker_path(c.tinker_path).result()
    deleted = [c.tinker_path for c in checkpoints]
    out.emit({"deleted": deleted}, "\n".join(f"Deleted {p}" for p in deleted))


def _set_public(public: bool) -> Callable[[RestClient, argparse.Namespace, Printer], None]:
    def command(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
        find_checkpoint(rc, args.path)
        if public:
            rc.publish_checkpoint_from_tinker_path(args.path).result()
        else:
            rc.unpublish_checkpoint_from_tinker_path(args.path).result()
        verb = "Published" if public else "Unpublished"
        out.emit({"tinker_path": args.path, "public": public}, f"{verb} {args.path}")

    return command


def checkpoint_set_ttl(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    if (args.ttl is None) == (not args.remove):
        raise errors.BadRequestError("set-ttl needs exactly one of --ttl SECONDS or --remove")
    rc.set_checkpoint_ttl_from_tinker_path(args.path, None if args.remove else args.ttl).result()
    expires = find_checkpoint(rc, args.path).expires_at
    message = f"{args.path} expires {format_relative(expires, never='never')}"
    out.emit({"tinker_path": args.path, "expires_at": expires.isoformat() if expires else None}, message)


# ---------------------------------------------------------------------------------------------------------
# run commands
# ---------------------------------------------------------------------------------------------------------


def run_list(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    response = rc.list_training_runs(limit=args.limit).result()

    def table() -> Table:
        total = response.cursor.total_count if response.cursor else len(response.training_runs)
        t = Table(title=f"Training runs ({len(response.training_runs)} of {total})")
        for column in ("ID", "Model", "LoRA", "Updated", "Status"):
            t.add_column(column, overflow="fold")
        for run in response.training_runs:
            lora = f"rank {run.lora_rank}" if run.is_lora else "full"
            status = "corrupted" if run.corrupted else "ok"
            t.add_row(
                run.training_run_id, run.base_model, lora, format_relative(run.last_request_time), status
            )
        return t

    out.emit(response, table)


def run_info(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    run = rc.get_training_run(args.run_id).result()
    last, last_sampler = run.last_checkpoint, run.last_sampler_checkpoint
    rows = [
        ("Training Run ID", run.training_run_id),
        ("Base Model", run.base_model),
        ("LoRA Rank", str(run.lora_rank)),
        ("Last Request", format_relative(run.last_request_time)),
        ("Last Checkpoint", last.tinker_path if last else "-"),
        ("Last Sampler Checkpoint", last_sampler.tinker_path if last_sampler else "-"),
        ("Corrupted", "Yes" if run.corrupted else "No"),
        ("User Metadata", json.dumps(run.user_metadata) if run.user_metadata else "-"),
    ]
    out.emit(run, lambda: _properties_table(f"Training run: {run.training_run_id}", rows))


# ---------------------------------------------------------------------------------------------------------
# weights and chat (imported when used: they load torch and transformers)
# ---------------------------------------------------------------------------------------------------------


def _folder_summary(path: Path) -> tuple[int, list[str]]:
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return sum(p.stat().st_size for p in files), [p.relative_to(path).as_posix() for p in files]


def weights_merge(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    from tinker_cookbook.weights import build_hf_model

    started = time.perf_counter()
    target = Path(build_hf_model(adapter_path=args.path, output_path=args.output, base_model=args.base_model,
                                 dtype=args.dtype, renderer_name=args.renderer, log_path=args.log_path,
                                 base_url=args.base_url, max_shard_bytes=int(args.max_shard_gb * 1e9),
                                 force=args.force))
    size, files = _folder_summary(target)
    seconds = time.perf_counter() - started
    out.emit({"path": str(target), "files": files, "size_bytes": size, "seconds": round(seconds, 2)},
             f"Merged {args.path} into {target} ({format_size(size)}, {seconds:.1f} s)")


def weights_adapter(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    from tinker_cookbook.weights import build_lora_adapter

    target = Path(build_lora_adapter(adapter_path=args.path, output_path=args.output, base_model=args.base_model,
                                     renderer_name=args.renderer, log_path=args.log_path, base_url=args.base_url,
                                     force=args.force))
    size, files = _folder_summary(target)
    out.emit({"path": str(target), "files": files, "size_bytes": size},
             f"Wrote the PEFT adapter of {args.path} to {target} ({format_size(size)})")


def weights_export_gguf(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    from tinker_cookbook.weights import export_gguf

    started = time.perf_counter()
    target = Path(export_gguf(args.model, args.output, quant=args.type, ollama=args.ollama, force=args.force))
    seconds = time.perf_counter() - started
    data = {"path": str(target), "size_bytes": target.stat().st_size, "type": args.type,
            "seconds": round(seconds, 2), "modelfile": str(target.parent / "Modelfile") if args.ollama else None}
    message = f"Wrote {target} ({args.type}, {format_size(target.stat().st_size)}, {seconds:.1f} s)"
    if args.ollama:
        message += f"; Ollama: ollama create NAME -f {target.parent / 'Modelfile'}"
    out.emit(data, message)


def weights_publish(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    from tinker_cookbook.weights import build_hf_model, publish

    folder = args.model
    if args.model.startswith("tinker://"):  # merge first, then push the merged folder
        if not args.output:
            raise ConfigurationError("publishing a tinker:// checkpoint merges it first: pass -o FOLDER for the merged "
                                     "model (or pass a folder written by `weights merge`)")
        folder = build_hf_model(adapter_path=args.model, output_path=args.output, base_url=args.base_url,
                                force=args.force)
        print(f"Merged {args.model} into {folder}", file=sys.stderr)
    url = publish(folder, args.repo, private=args.private)
    out.emit({"path": folder, "url": url}, f"Pushed {folder} to {url}")


def chat(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    from tinker_cookbook.chat import ChatSettings, open_target, run_chat

    target = open_target(args.model, base_url=args.base_url, renderer_name=args.renderer)
    settings = ChatSettings(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                            chunk_tokens=args.chunk_tokens)
    run_chat(target, settings, system=args.system)


# ---------------------------------------------------------------------------------------------------------
# serve
# ---------------------------------------------------------------------------------------------------------

API_KEY_ENV = "TINKER_COOKBOOK_API_KEY"


def serve(rc: RestClient, args: argparse.Namespace, out: Printer) -> None:
    # Imported here: the server pulls in FastAPI and uvicorn, which the other commands do not need.
    from tinker_cookbook.backends import launched_with_ranks, serving_backend
    from tinker_cookbook.server import ServerLimits, generate_api_key
    from tinker_cookbook.server import serve as run_server
    from tinker_cookbook.server.app import check_bind

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.generate_api_key:
        if api_key:
            raise ConfigurationError(f"--generate-api-key and an API key (--api-key or ${API_KEY_ENV}) were both "
                                     "given; pass one")
        api_key = generate_api_key()
    check_bind(args.host, api_key)  # refuse an unsafe bind before anything starts
    if args.nproc_per_node > 1 and not launched_with_ranks():
        from tinker_cookbook.server.launch import launch_ranks

        raise SystemExit(launch_ranks(args.nproc_per_node, sys.argv[1:]))  # each rank runs this command again
    perf_env.reexec_with_fast_malloc()  # sampling is several times faster with it (see perf_env); restarts once
    backend = serving_backend(on_failure=_stop_serving)
    if backend is None:
        return  # a rank other than 0: it ran rank 0's commands until rank 0 stopped
    ranks = getattr(backend, "describe_ranks", None)
    chosen = {"max_body_bytes": args.max_body_bytes, "max_n": args.max_n,
              "max_samples_per_request": args.max_samples_per_request}
    limits = ServerLimits(**{k: v for k, v in chosen.items() if v is not None})
    run_server(backend, host=args.host, port=args.port, api_key=api_key,
               key_generated=args.generate_api_key, limits=limits, preload=args.model or (),
               access_log=args.access_log, allowed_hosts=args.allow_host or (),
               allowed_origins=args.allow_origin or (),
               announce=None if ranks is None else lambda text: print(f"{text}\n  Ranks:       {ranks()}",
                                                                      flush=True))


def _stop_serving(message: str) -> None:
    """A rank stopped: the ranked engine cannot answer anything any more, so the whole server stops now."""
    print(f"tinker-cookbook serve: {message}; stopping the server", file=sys.stderr, flush=True)
    from tinker_cookbook.backends import LOST_RANK_STATUS

    os._exit(LOST_RANK_STATUS)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


# ---------------------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------------------


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; use 0 for all")
    return value


FORMATS = ("table", "json")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tinker-cookbook",
        description="Inspect and manage the training runs and checkpoints of the local store "
        "($TINKER_COOKBOOK_HOME, default ~/.tinker_cookbook).",
        epilog="examples:\n" + __doc__.split("::\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-f", "--format", choices=FORMATS, default="table", help="output format (also accepted "
                        "after the subcommand)")
    parser.add_argument("--version", action="version", version=f"tinker-cookbook {__version__}")
    # The same option on every subcommand; SUPPRESS keeps a value given before the subcommand when none is after.
    fmt = argparse.ArgumentParser(add_help=False)
    fmt.add_argument("-f", "--format", choices=FORMATS, default=argparse.SUPPRESS, help="output format")
    groups = parser.add_subparsers(dest="group", required=True, metavar="{checkpoint,run,weights,chat,serve}")

    ckpt = groups.add_parser("checkpoint", help="list, inspect, download, delete and publish checkpoints")
    ckpt_cmds = ckpt.add_subparsers(dest="command", required=True)
    p = ckpt_cmds.add_parser("list", parents=[fmt], help="checkpoints, newest first")
    p.add_argument("--run-id", help="only this training run's checkpoints")
    p.add_argument("--limit", type=_non_negative, default=20, help="how many to show (0 = all)")
    p.set_defaults(handler=checkpoint_list)
    p = ckpt_cmds.add_parser("info", parents=[fmt], help="properties of one checkpoint")
    p.add_argument("path", help="tinker://<run_id>/(weights|sampler_weights)/<name>")
    p.set_defaults(handler=checkpoint_info)
    _add_download(ckpt_cmds, fmt)
    p = ckpt_cmds.add_parser("delete", parents=[fmt], help="delete checkpoints")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(handler=checkpoint_delete)
    for command, public in (("publish", True), ("unpublish", False)):
        p = ckpt_cmds.add_parser(command, parents=[fmt], help=f"mark a checkpoint {'public' if public else 'private'}")
        p.add_argument("path")
        p.set_defaults(handler=_set_public(public))
    p = ckpt_cmds.add_parser("set-ttl", parents=[fmt], help="expire a checkpoint after some seconds, or never")
    p.add_argument("path")
    p.add_argument("--ttl", type=int, help="seconds from now")
    p.add_argument("--remove", action="store_true", help="keep the checkpoint until deleted")
    p.set_defaults(handler=checkpoint_set_ttl)

    run = groups.add_parser("run", help="list and inspect training runs")
    run_cmds = run.add_subparsers(dest="command", required=True)
    p = run_cmds.add_parser("list", parents=[fmt], help="training runs, newest first")
    p.add_argument("--limit", type=_non_negative, default=20, help="how many to show (0 = all)")
    p.set_defaults(handler=run_list)
    p = run_cmds.add_parser("info", parents=[fmt], help="properties of one training run")
    p.add_argument("run_id")
    p.set_defaults(handler=run_info)

    _add_weights(groups, fmt)
    _add_chat(groups)

    p = groups.add_parser(
        "serve", help="serve the engine over HTTP (OpenAI-compatible /v1 routes and the Tinker API)",
        description="Serve the local engine over HTTP: OpenAI-compatible /v1/models, /v1/completions and "
        "/v1/chat/completions for base models and tinker:// sampler checkpoints, and the Tinker API. Loopback "
        "only by default; any other --host needs an API key.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", help=f"require this key (at least 16 characters; default ${API_KEY_ENV})")
    p.add_argument("--generate-api-key", action="store_true", help="require a random key, printed at start")
    p.add_argument("--model", action="append", metavar="NAME",
                   help="load this base model or tinker:// path before serving (repeatable; others load on "
                   "first use)")
    # Defaults live in ServerLimits (not repeated here, so that `tinker-cookbook --help` imports no server code).
    p.add_argument("--max-body-bytes", type=_positive, help="largest request body (default 8 MiB)")
    p.add_argument("--max-n", type=_positive, help="largest n per request (default 16)")
    p.add_argument("--max-samples-per-request", type=_positive, help="largest prompts x n per request (default 64)")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="also answer requests addressed to this host name (repeatable; '*' for any). A loopback "
                   "server otherwise answers only localhost, 127.0.0.1 and [::1] (DNS rebinding guard)")
    p.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                   help="let web pages from this origin (e.g. https://app.example) call the server (repeatable; "
                   "'*' for any). Otherwise only pages on localhost may")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--nproc-per-node", type=_positive, default=1, metavar="N",
                   help="run N ranks on this machine, one per device (torchrun's launcher): training requests are "
                   "split over them and sampling spread (see docs/scaling.md); default 1")
    p.set_defaults(handler=serve)
    return parser


def _add_download(commands: Any, fmt: argparse.ArgumentParser) -> None:
    p = commands.add_parser("download", parents=[fmt], help="extract a checkpoint into <run>_<type>_<name>/ (a sampler checkpoint "
                            "is a PEFT adapter folder)")
    p.add_argument("path", help="tinker://<run_id>/(weights|sampler_weights)/<name>")
    p.add_argument("-o", "--output", default=".", help="directory to extract into (default: current)")
    p.add_argument("--force", action="store_true", help="replace an existing download")
    p.add_argument("--base-url", help="the Tinker-protocol server holding the checkpoint (default: the local store)")
    p.set_defaults(handler=checkpoint_download)


def _add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="tinker://<run_id>/sampler_weights/<name>, or a downloaded adapter folder")
    p.add_argument("-o", "--output", required=True, help="the folder to create")
    p.add_argument("--base-model", help="a model name or Hugging Face folder (default: the adapter's base model)")
    p.add_argument("--renderer", help="chat format of the saved tokenizer (default: the run's renderer)")
    p.add_argument("--log-path", help="the run's log folder: its config and final metrics go into the model card")
    p.add_argument("--base-url", help="the Tinker-protocol server holding the checkpoint (default: the local store)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")


def _add_weights(groups: Any, fmt: argparse.ArgumentParser) -> None:
    from tinker_cookbook.weights import DTYPE_NAMES, QUANT_NAMES

    weights = groups.add_parser("weights", help="merge, convert, export and publish trained weights",
                                description="Trained weights out of the store; see docs/weights.md.")
    cmds = weights.add_subparsers(dest="command", required=True)
    _add_download(cmds, fmt)
    p = cmds.add_parser("merge", help="the base model with the adapter merged in: a Hugging Face model folder")
    _add_export_args(p)
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                   help="weights dtype (default auto: as stored in the base model)")
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors shard (default 5 GB)")
    p.set_defaults(handler=weights_merge)
    p = cmds.add_parser("adapter", help="the adapter alone, in the PEFT layout vLLM and SGLang load")
    _add_export_args(p)
    p.set_defaults(handler=weights_adapter)
    p = cmds.add_parser("export-gguf", help="a merged folder as one GGUF file (llama.cpp, Ollama)")
    p.add_argument("model", help="a folder written by `weights merge`")
    p.add_argument("-o", "--output", required=True, help="the .gguf file to write")
    p.add_argument("--type", choices=QUANT_NAMES, default="f16", help="tensor type (default f16)")
    p.add_argument("--ollama", action="store_true", help="also write an Ollama Modelfile beside the file")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(handler=weights_export_gguf)
    p = cmds.add_parser("publish", help="push a merged (or adapter) folder to the Hugging Face Hub")
    p.add_argument("model", help="a folder written by `weights merge`/`weights adapter`, or a tinker:// sampler "
                   "path (merged into -o first)")
    p.add_argument("--repo", required=True, help="USER/NAME on the Hub")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("-o", "--output", help="where to merge a tinker:// path before pushing")
    p.add_argument("--base-url", help="the Tinker-protocol server holding the checkpoint")
    p.add_argument("--force", action="store_true", help="replace an existing merged folder")
    p.set_defaults(handler=weights_publish)


def _add_chat(groups: Any) -> None:
    p = groups.add_parser("chat", help="talk to a checkpoint, a base model or a merged folder in the terminal",
                          description="Interactive chat: /reset, /system TEXT, /save FILE.jsonl, /exit; Ctrl-C stops "
                          "a reply, Ctrl-D leaves.")
    p.add_argument("model", help="tinker://<run_id>/sampler_weights/<name>, a base model name, or a merged folder")
    p.add_argument("--base-url", help="a Tinker-protocol server to sample on (default: the local engine)")
    p.add_argument("--renderer", help="the chat format (default: the run's renderer, else the model's recommended)")
    p.add_argument("--system", help="a system message to start with")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7; 0 = greedy)")
    p.add_argument("--max-tokens", type=_positive, default=512, help="longest reply in tokens (default 512)")
    p.add_argument("--seed", type=int, help="seed for reproducible sampling")
    p.add_argument("--chunk-tokens", type=_positive, default=8,
                   help="tokens asked per request while streaming (default 8; smaller shows text sooner)")
    p.set_defaults(handler=chat)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (errors print one line to stderr and return 1)."""
    args = build_parser().parse_args(argv)
    try:
        args.handler(RestClient(), args, Printer(args.format))  # the local store; no engine needed
    except (errors.TinkerError, TinkerCookbookError, OSError, tarfile.TarError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
