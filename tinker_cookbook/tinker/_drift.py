"""Tinker-protocol servers that speak an older protocol than the official SDK this project uses (``tinker==0.38.0``).

Some open servers answer the current SDK's newer requests the old way. Which SDK versions changed what (read from
each release's source):

- connecting: since tinker 0.18.0 the SDK asks ``/api/v1/client/config`` for the server's settings before anything
  else and stops when that route is missing (404); 0.16.1 and earlier never ask. SkyRL-tx 0.3.0 has no such route:
  no client of this project's SDK reaches it, while the official SDK 0.16.1, used directly, trains, samples and
  resumes on it;
- protobuf: since tinker 0.25.0 the SDK always sends ``forward_backward`` as protobuf and reads sampling and
  ``forward_backward`` results only as protobuf, failing with a ``ValueError`` on a JSON result; 0.24.1 and
  earlier read JSON results (and send protobuf only when the server's client config asks);
- sampling: since tinker 0.26.0 the SDK requires the sampling future to carry ``sample_sequence_ids`` (one id per
  sample, for provenance spans) and fails with an ``AssertionError`` when a server sends none; 0.25.0 and earlier
  sample from such a server;
- resuming (``create_training_client_from_state*``): since tinker 0.24.1 the SDK creates the client and loads the
  checkpoint in one ``load_weights`` request addressed by ``session_id`` and ``model_seq_id``; a server that needs
  ``model_id`` there (the older addressing: create the model, then load) refuses it with 400/422. 0.24.0 and
  earlier create, then load.

This module recognises these answers and says so: the remote backend turns a missing client config, a JSON result
and a sampling answer without ids into errors that name the server, what it lacks and the SDK range that works,
and falls back for the older resume (create the client, then
``load_state``), which gives the same client as the one-request form.
"""

from __future__ import annotations

from tinker_cookbook.tinker import errors

CLIENT_CONFIG_ROUTE = "/api/v1/client/config"
CLIENT_CONFIG_SDK_RANGE = "tinker<=0.16.1"
"""The official SDKs that connect to a server without ``/api/v1/client/config`` (0.17 was never released)."""
JSON_RESULTS_SDK_RANGE = "tinker<=0.24.1"
"""The official SDKs that read sampling and ``forward_backward`` results sent as JSON."""
SAMPLING_SDK_RANGE = "tinker<=0.25.0"
"""The official SDKs that sample from a server that sends no sample sequence ids."""
RESUME_SDK_RANGE = "tinker<=0.24.0"
"""The official SDKs that resume (create, then load) on a server that needs ``model_id`` in ``load_weights``."""
OLD_PROTOCOL_SDK_RANGE = RESUME_SDK_RANGE
"""The official SDKs that do both against such a server."""


def sdk_version() -> str:
    try:
        import tinker

        return str(getattr(tinker, "__version__", "?"))
    except ImportError:
        return "?"


def lacks_client_config(exc: BaseException) -> bool:
    """The SDK's failure when the server has no ``/api/v1/client/config`` route (an older server)."""
    if int(getattr(exc, "status_code", 0) or 0) != 404:
        return False
    request = getattr(getattr(exc, "response", None), "request", None)
    return str(getattr(getattr(request, "url", None), "path", "")).endswith(CLIENT_CONFIG_ROUTE)


def client_config_drift_error(base_url: str) -> errors.NotFoundError:
    return errors.NotFoundError(
        f"connecting to {base_url}: the server has no {CLIENT_CONFIG_ROUTE} route, which the official tinker SDK "
        f"{sdk_version()} asks first (every SDK since 0.18.0 does): the server speaks an older Tinker protocol (as "
        "SkyRL-tx 0.3.0 does), and this project's remote backend, which needs tinker==0.38.0, cannot use it. Use "
        f"the official SDK directly in the range {CLIENT_CONFIG_SDK_RANGE} with that server, or update the server to "
        f"one that answers {CLIENT_CONFIG_ROUTE}"
    )


def answered_json_not_protobuf(exc: BaseException) -> bool:
    """The SDK's failure on a JSON result where it reads only protobuf (a server older than tinker 0.25.0)."""
    return isinstance(exc, ValueError) and "only supports as proto" in str(exc)


def json_result_drift_error(base_url: str) -> errors.APIResponseValidationError:
    return errors.APIResponseValidationError(
        f"the server at {base_url} sent a result as JSON, where the official tinker SDK {sdk_version()} reads "
        "sampling and forward_backward results only as protobuf (every SDK since 0.25.0 does): the server speaks "
        "an older Tinker protocol, and this project's remote backend, which needs tinker==0.38.0, cannot use it "
        f"for this. Use the official SDK directly in the range {JSON_RESULTS_SDK_RANGE} with that server, or update "
        "the server to one that answers in protobuf"
    )


def lacks_sample_sequence_ids(exc: BaseException) -> bool:
    """The SDK's failure on a sampling answer without ``sample_sequence_ids`` (an older server)."""
    return isinstance(exc, AssertionError) and "sample_sequence_ids" in str(exc)


def sampling_drift_error(base_url: str) -> errors.APIResponseValidationError:
    return errors.APIResponseValidationError(
        f"the server at {base_url} answered a sampling request without sample_sequence_ids, which the official "
        f"tinker SDK {sdk_version()} requires (it attaches them to every sampled sequence): the server speaks an "
        "older Tinker protocol (SkyRL-tx 0.3.0 sends none). Training may still work; to sample, use the official SDK "
        f"directly in the range {SAMPLING_SDK_RANGE} ({OLD_PROTOCOL_SDK_RANGE} to resume from checkpoints too; "
        "this project's remote backend needs tinker==0.38.0), or update the server to one that sends "
        "sample_sequence_ids"
    )


def needs_model_id(exc: BaseException) -> bool:
    """A ``load_weights`` refusal that names ``model_id``: the server wants the older addressing (create the model,
    then load into its ``model_id``) instead of the SDK's one-request create-and-load."""
    status = int(getattr(exc, "status_code", 0) or 0)
    if status not in (400, 422) and not isinstance(exc, errors.BadRequestError):
        return False
    text = f"{getattr(exc, 'body', None)} {exc}"
    return "model_id" in text and ("required" in text.lower() or "missing" in text.lower())


def resume_fallback_note(base_url: str) -> str:
    return (f"the server at {base_url} refused the one-request resume of tinker {sdk_version()} (it needs "
            f"model_id in load_weights, the protocol of {RESUME_SDK_RANGE}); resumed by creating the client and "
            "then loading the checkpoint")


def resume_drift_error(base_url: str, path: str, cause: BaseException) -> errors.BadRequestError:
    """When the fallback could not run either (the checkpoint's base model or rank is not known to the server)."""
    return errors.BadRequestError(
        f"resuming from {path} on {base_url} failed: the server speaks an older Tinker protocol (it needs model_id "
        f"in load_weights, as in {RESUME_SDK_RANGE}), and creating a client and loading the checkpoint into it "
        f"failed too ({type(cause).__name__}: {cause}). Check that the checkpoint exists on that server, or use "
        f"the official SDK directly in the range {RESUME_SDK_RANGE}"
    )
