"""The one error vocabulary, from a model's validation to the client's exception.

Every process role uses it: the models inside the Triton stub (rufus_llm, the planner, the
assistant) raise and send these errors, the gRPC client (:mod:`rufus.client`) parses them
back, and the OpenAI frontend derives its HTTP status and error body from them. Like
text-generation-inference's typed errors, the *type* carries the class of failure and
everything else (Triton code, HTTP status, metric outcome, retry rule) is derived from it:

==================  ============  ====  ==========  =======================================
error               Triton code   HTTP  outcome     when
==================  ============  ====  ==========  =======================================
InvalidInput        INVALID_ARG   400   invalid     the client's input; names the field
Unavailable         UNAVAILABLE   503   unavailable engine dead/restarting, unit down: retry
AtCapacity          UNAVAILABLE   503   rejected    admission bound reached: retry
Cancelled           CANCELLED     499   cancelled   the client went away
NotFound            NOT_FOUND     503   unavailable the model is not loaded (client side)
DeadlineExceeded    (gRPC)        504   timeout     the client's deadline passed (client side)
Internal            INTERNAL      500   error       anything else: a short message with an id
==================  ============  ====  ==========  =======================================

The wire form is Triton's error message ``[CODE] <message>``: Triton's gRPC *stream* carries
only the message, not the code, so the code travels in it (and
``pb_utils.TritonError(code=...)`` carries it where Triton can). :func:`from_wire` is the one
parser of that form. :func:`client_error` is the one mapping of an arbitrary exception to
what a client may see: an unexpected exception becomes :class:`Internal` with an id that is
logged with the traceback, so the client never sees a traceback, a server path or an
exception's text.
"""

from __future__ import annotations

import logging
import secrets
from enum import StrEnum
from typing import ClassVar, Literal

MAX_REASON_CHARS = 300    # an InvalidInput reason (and so its log line) is never longer
MAX_WIRE_CHARS = 1000     # no error message on the wire is longer

# An error's ``outcome`` metric label (the table above).
Outcome = Literal["error", "invalid", "unavailable", "rejected", "cancelled", "timeout"]


class Code(StrEnum):
    """Triton's status names (``pb_utils.TritonError`` / gRPC)."""

    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    CANCELLED = "CANCELLED"
    NOT_FOUND = "NOT_FOUND"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"


class RufusError(Exception):
    """Base of every error a client may see; subclasses fix the class of failure."""

    code: ClassVar[Code] = Code.INTERNAL
    http_status: ClassVar[int] = 500
    outcome: ClassVar[Outcome] = "error"   # the ``outcome`` label of rufus_requests_total
    retryable: ClassVar[bool] = False  # another unit (or a later try) may succeed

    def __init__(self, message: str) -> None:
        if len(message) > MAX_WIRE_CHARS:
            message = message[:MAX_WIRE_CHARS] + "..."
        super().__init__(message)
        self.message = message

    def wire(self) -> str:
        """The Triton error message: ``[CODE] message``."""
        return f"[{self.code}] {self.message}"

    def __str__(self) -> str:
        return self.message


class InvalidInput(RufusError, ValueError):
    """The client's input is wrong: ``<field>: <reason>``.

    ``field`` and ``reason`` are data, so callers re-target an error (the planner's
    ``history``, the frontend's OpenAI ``param``) by the field, never by rewriting text.
    """

    code = Code.INVALID_ARG
    http_status = 400
    outcome = "invalid"

    def __init__(self, field_name: str, reason: str) -> None:
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "..."
        super().__init__(f"{field_name}: {reason}" if field_name else reason)
        self.field = field_name
        self.reason = reason

    def retarget(self, field_name: str) -> InvalidInput:
        """The same reason, blamed on another name for the same input."""
        return InvalidInput(field_name, self.reason)


class Unavailable(RufusError):
    """This server cannot serve now (engine dead or restarting, unit down): retry."""

    code = Code.UNAVAILABLE
    http_status = 503
    outcome: ClassVar[Outcome] = "unavailable"  # a subclass may count itself apart
    retryable = True


class AtCapacity(Unavailable):
    """The admission bound is reached: refused at once rather than queued."""

    outcome = "rejected"


class NotFound(Unavailable):
    """The model is not loaded here (Triton's "Request for unknown model"). Behind a load
    balancer every unit serves the same models, so another unit may have it: retryable."""

    code = Code.NOT_FOUND


class Cancelled(RufusError):
    """The client cancelled the request (or went away)."""

    code = Code.CANCELLED
    http_status = 499
    outcome = "cancelled"


class DeadlineExceeded(RufusError):
    """The client's deadline passed before the answer (a client-side status)."""

    code = Code.DEADLINE_EXCEEDED
    http_status = 504
    outcome = "timeout"


class Internal(RufusError):
    """A failure that is nobody's input: a short message plus an id the server logged."""

    code = Code.INTERNAL

    def __init__(self, message: str = "internal error", error_id: str | None = None) -> None:
        self.error_id = error_id or new_error_id()
        super().__init__(f"{message} (error id {self.error_id})")

    @classmethod
    def received(cls, message: str) -> Internal:
        """An INTERNAL error read off the wire: its id, if any, is already in the text."""
        err = cls.__new__(cls)
        RufusError.__init__(err, message)
        err.error_id = ""
        return err


BY_CODE: dict[Code, type[RufusError]] = {
    Code.INVALID_ARG: InvalidInput, Code.UNAVAILABLE: Unavailable, Code.CANCELLED: Cancelled,
    Code.NOT_FOUND: NotFound, Code.DEADLINE_EXCEEDED: DeadlineExceeded, Code.INTERNAL: Internal,
}


def new_error_id() -> str:
    return secrets.token_hex(4)


def client_error(exc: BaseException, log: logging.Logger, context: str) -> RufusError:
    """What a client sees for ``exc``: a :class:`RufusError` as it is; anything else is an
    :class:`Internal` error whose id is logged here with the traceback (``context`` says
    which request), so the operator can find it and the client sees no server detail."""
    if isinstance(exc, RufusError):
        return exc
    err = Internal(f"internal error ({type(exc).__name__})")
    log.error("%s: internal error id %s", context, err.error_id, exc_info=exc)
    return err


# gRPC statuses outside Triton's set, read as the nearest code: a server out of resources
# (RESOURCE_EXHAUSTED) cannot take the request now.
_ALIASES = {"RESOURCE_EXHAUSTED": Code.UNAVAILABLE}


def _code_in(status: str) -> Code | None:
    """``INVALID_ARG``, ``StatusCode.UNAVAILABLE`` (grpc), ... -> the code it names."""
    name = status.rsplit(".", 1)[-1].strip().upper()
    return Code(name) if name in Code.__members__ else _ALIASES.get(name)


def from_wire(message: str, status: str = "") -> RufusError:
    """The one parser of the wire form: an error message (``[CODE] text``, with or without a
    ``<model>: `` prefix) and the transport's status when it has one -> the typed error.

    The code in the message wins (the gRPC stream drops Triton's code, and our models put it
    there); then the transport's status; then Triton's own unknown-model message."""
    text = message.strip()
    code = None
    head, sep, rest = text.partition("] ")
    if sep and "[" in head:
        code = _code_in(head[head.rindex("[") + 1:])
        if code is not None:
            text = rest
    if code is None and status:
        code = _code_in(status)
    if code is None and "Request for unknown model" in message:
        code = Code.NOT_FOUND
    if code is None:
        code = Code.INTERNAL
    if code is Code.INVALID_ARG:
        field_name, sep, reason = text.partition(": ")
        return InvalidInput(field_name, reason) if sep and " " not in field_name \
            else InvalidInput("", text)
    if code is Code.INTERNAL:
        return Internal.received(text)
    return BY_CODE[code](text)
