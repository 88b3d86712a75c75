"""Request errors that say what is wrong with the request and nothing about the server.

SGLang 0.5.17 answers a request FastAPI cannot validate (malformed JSON, a field of the wrong type) with
``str(RequestValidationError)`` (``http_server.validation_exception_handler``), and FastAPI's ``str`` ends with the
endpoint's source location: the 400 body carried ``File "/.../sglang/srt/entrypoints/http_server.py", line 869, in
generate_request``. The plugin replaces that handler when the HTTP server is set up (a BEFORE hook on
``http_server._setup_and_run_http_server``), for every algorithm: malformed JSON is named with its line and column,
other errors by field and reason. SGLang's own envelopes are kept: ``ErrorResponse`` (``/v1/responses``: its nested
``error``), and ``/v1/messages`` keeps SGLang's Anthropic handler, which already scrubs its messages.

A token id outside the model's vocabulary (``input_ids`` are the client's to give) reached the embedding: SGLang
0.5.17 has the check (``TokenizerManager._validate_input_ids_in_vocab``) but never calls it, and one request with
``input_ids: [1000]`` on a 64-token model ended the CPU engine's scheduler with an ``IndexError`` (a GPU's embedding
would trip a device-side assert), the server gone for every client. The plugin checks the ids where SGLang checks a
request's length, so the request gets the same 400 (not by calling SGLang's unused check: it lets negative ids
through and echoes the whole ``input_ids`` list, a prompt's worth, in the message).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse


def json_error_position(document: Any, position: int) -> str:
    """``line L column C`` (1-based) of ``position`` in ``document``, or ``position P`` when the document is unknown."""
    if isinstance(document, bytes):
        document = document.decode("utf-8", errors="replace")
    if not isinstance(document, str) or not 0 <= position <= len(document):
        return f"position {position}"
    line = document.count("\n", 0, position) + 1
    column = position - (document.rfind("\n", 0, position) + 1) + 1
    return f"line {line} column {column}"


def describe_validation_errors(errors: Sequence[dict[str, Any]], body: Any) -> str:
    """One sentence per error, naming the request's problem without the server's internals (no paths, no
    tracebacks, no echo of the whole body)."""
    parts = []
    for error in errors:
        loc_parts = tuple(error.get("loc", ()))
        loc = [str(part) for part in loc_parts]
        reason = str((error.get("ctx") or {}).get("error") or error.get("msg") or "invalid value")
        if error.get("type") == "json_invalid":
            position = loc_parts[-1] if loc_parts and isinstance(loc_parts[-1], int) else -1
            parts.append(f"malformed JSON at {json_error_position(body, position)}: {reason}")
        else:
            field = ".".join(loc[1:] if loc[:1] == ["body"] else loc) or "request body"
            parts.append(f"{field}: {error.get('msg') or reason}")
    return "; ".join(parts) or "invalid request"


async def answer_validation_error(request: Request, exc: RequestValidationError) -> ORJSONResponse:
    """SGLang's 400 envelopes with :func:`describe_validation_errors` as their message."""
    from http import HTTPStatus

    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints.openai.protocol import ErrorResponse

    if request.url.path.startswith("/v1/messages"):
        return await _SGLANG_HANDLERS["validation"](request, exc)
    message = describe_validation_errors(exc.errors(), getattr(exc, "body", None))
    status = HTTPStatus.BAD_REQUEST
    if request.url.path.startswith("/v1/responses"):
        nested = {"message": message, "type": status.phrase, "param": None, "code": status.value}
        return ORJSONResponse(status_code=status.value, content={"error": nested})
    return ORJSONResponse(
        status_code=status.value,
        content=ErrorResponse(message=message, type=status.phrase, code=status.value).model_dump(),
    )


def refuse_token_ids_outside_the_vocabulary(manager: Any, obj: Any, input_ids: Optional[list[int]], *args: Any,
                                            **kwargs: Any) -> None:  # fmt: skip
    """BEFORE ``TokenizerManager._validate_one_request`` (whose ``ValueError`` is the request's HTTP 400): the first
    id outside ``[0, vocab_size)`` is named with its position. Requests with images, video or audio are left to SGLang
    (their processors may place ids of their own)."""
    if not input_ids or any(getattr(obj, field, None) for field in ("image_data", "video_data", "audio_data")):
        return None
    vocab_size = manager.model_config.vocab_size
    if 0 <= min(input_ids) and max(input_ids) < vocab_size:
        return None
    position, token_id = next((i, t) for i, t in enumerate(input_ids) if not 0 <= t < vocab_size)
    raise ValueError(f"input_ids[{position}] = {token_id} is not a token of this model: its vocabulary is "
                     f"[0, {vocab_size})")  # fmt: skip


_SGLANG_HANDLERS: dict[str, Any] = {}


def install_request_error_handlers(*args: Any, **kwargs: Any) -> None:
    """BEFORE ``http_server._setup_and_run_http_server``: put :func:`answer_validation_error` in place of SGLang's
    handler on its app (before the first request, when Starlette builds the handler stack)."""
    from fastapi.exceptions import RequestValidationError
    from sglang.srt.entrypoints.http_server import app

    _SGLANG_HANDLERS.setdefault("validation", app.exception_handlers[RequestValidationError])
    app.add_exception_handler(RequestValidationError, answer_validation_error)
