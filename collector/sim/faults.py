"""Faults the fake API server injects into the next matching request(s).

Each action reproduces a failure a real cluster (or the load balancer in front of it) produces,
as catalogued in watch-semantics.md §4 (abnormal stream ends), §5.5 (ERROR events), §7 (how a
watch ends) and §8 (HTTP errors):

==========================  =====================================================================
action                      effect
==========================  =====================================================================
``stall``                   headers sent, then no byte for ``seconds`` (socket open), then normal
``reset_before_headers``    TCP RST (SO_LINGER 0 + close) before any response byte
``reset_mid_stream``        RST after ``after_events`` complete events (list: mid-body)
``cut_mid_event``           FIN in the middle of event ``after_events``+1, no terminating chunk:
                            the complete events go out in complete chunks, then half the event
                            as a chunk of its own (``mid_chunk=True``: the chunk header announces
                            the whole event and the FIN falls inside it). List: FIN mid-body
``split_utf8``              the next event holding a multi-byte character is split inside that
                            character across two chunks, flushed ``pause_s`` apart
``delay_newline``           the next event's final ``\\n`` comes in a later chunk, ``pause_s`` later
``status``                  HTTP ``code`` with a Status JSON body (429: plain text body of §8
                            unless ``plain=False``); optional ``retry_after`` seconds header
``http_410``                plain HTTP 410 Expired Status on a watch request
``inject_line``             ``raw`` + ``\\n`` written as one event line once ``after_events`` real
                            events were written, before the next one (invalid JSON, wrongly
                            typed field…)
``close_immediately``       200, zero events, clean end (``0\\r\\n\\r\\n``)
``error_event``             ERROR 410 Expired as the first event, then clean end
==========================  =====================================================================
"""

from __future__ import annotations

import copy
import threading
from typing import Any

#: action -> (verbs it can apply to, allowed params with defaults)
ACTIONS: dict[str, tuple[frozenset[str], dict[str, Any]]] = {
    "stall": (frozenset({"watch", "list", "get"}), {"seconds": 5.0}),
    "reset_before_headers": (frozenset({"watch", "list", "get", "create", "update", "delete"}), {}),
    "reset_mid_stream": (frozenset({"watch", "list"}), {"after_events": 0}),
    "cut_mid_event": (frozenset({"watch", "list"}), {"after_events": 0, "mid_chunk": False}),
    "split_utf8": (frozenset({"watch"}), {"pause_s": 0.05}),
    "delay_newline": (frozenset({"watch"}), {"pause_s": 0.05}),
    "status": (
        frozenset({"watch", "list", "get", "create", "update", "delete"}),
        {"code": 500, "retry_after": None, "message": None, "reason": None, "plain": None, "causes": None},
    ),
    "http_410": (frozenset({"watch"}), {"message": None}),
    "inject_line": (frozenset({"watch"}), {"raw": b"", "after_events": 0}),
    "close_immediately": (frozenset({"watch"}), {}),
    "error_event": (frozenset({"watch"}), {"message": None}),
}

VERBS = ("any", "watch", "list", "get", "create", "update", "delete")

#: Faults that change what a stream carries rather than how the connection behaves; several of
#: them can apply to the same watch request (see :meth:`FaultQueue.take`).
CONTENT_ACTIONS = frozenset({"inject_line", "split_utf8", "delay_newline"})


class Fault:
    """A fault consumed by the next ``count`` requests matching ``kind`` and ``verb``.

    A request takes the first matching fault; content faults (``inject_line``,
    ``split_utf8``, ``delay_newline``) queued for the same request all apply to it (:meth:`FaultQueue.take`).

    Args:
        kind: kind the request targets (``"Pod"``, ``"ResourceClaim"``…); None = any kind.
            ``"discovery"`` targets discovery GETs (``/version``, ``/api``, ``/apis/…``), which
            only take ``status`` and ``reset_before_headers`` faults and only when named so.
        verb: ``"watch"`` | ``"list"`` | ``"get"`` | ``"create"`` | ``"update"`` | ``"delete"``
            | ``"any"``. A fault only matches requests its action applies to (e.g. ``split_utf8``
            only watches), whatever ``verb`` says.
        action: one of :data:`ACTIONS` (see the module docstring).
        count: how many matching requests consume it (>= 1).
        namespace: only requests for this namespace path (None = any).
        **params: the action's parameters (``seconds``, ``after_events``, ``code``,
            ``retry_after``, ``raw``, ``pause_s``, ``message``, ``reason``, ``plain``).

    Raises:
        ValueError: unknown action/verb, unknown parameter, bad count.
    """

    def __init__(
        self,
        kind: str | None = None,
        verb: str = "any",
        action: str = "",
        count: int = 1,
        namespace: str | None = None,
        **params: Any,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"Fault action {action!r}: use one of {sorted(ACTIONS)}")
        if verb not in VERBS:
            raise ValueError(f"Fault verb {verb!r}: use one of {VERBS}")
        if count < 1:
            raise ValueError(f"Fault count={count}: must be >= 1")
        verbs, defaults = ACTIONS[action]
        unknown = set(params) - set(defaults)
        if unknown:
            raise ValueError(f"Fault {action}: unknown parameter(s) {sorted(unknown)}; allowed {sorted(defaults)}")
        self.kind = kind
        self.verb = verb
        self.action = action
        self.count = count
        self.namespace = namespace
        self.params: dict[str, Any] = {**defaults, **params}
        raw = self.params.get("raw")
        if action == "inject_line" and isinstance(raw, str):
            self.params["raw"] = raw.encode("utf-8")
        self._verbs = verbs

    def matches(self, kind: str | None, verb: str, namespace: str | None) -> bool:
        """Whether a request (``kind``, ``verb``, ``namespace`` of its path) consumes this fault."""
        if verb not in self._verbs:
            return False
        if self.verb != "any" and self.verb != verb:
            return False
        if self.kind is not None and self.kind != kind:
            return False
        return self.namespace is None or self.namespace == namespace

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fault):
            return NotImplemented
        return (self.kind, self.verb, self.action, self.count, self.namespace, self.params) == (
            other.kind, other.verb, other.action, other.count, other.namespace, other.params
        )

    __hash__ = None  # mutable value object (count changes as it is consumed)

    def __getattr__(self, name: str) -> Any:
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self.params.items() if v not in (None, b"", {}))
        return f"Fault(kind={self.kind!r}, verb={self.verb!r}, action={self.action!r}, count={self.count}, {extra})"

    @classmethod
    def from_dict(cls, data: dict) -> "Fault":
        """Build from a scenario mapping ``{kind, verb, action, count, namespace, <params>}``."""
        return cls(**copy.deepcopy(data))


class FaultQueue:
    """Thread-safe FIFO of faults; the first matching fault is consumed per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> int:
        """Drop every queued fault (an outage ends); returns how many were queued."""
        with self._lock:
            n, self._faults = len(self._faults), []
        return n

    def take(self, kind: str | None, verb: str, namespace: str | None) -> list[Fault]:
        """Consume the faults a request gets: the first matching fault, one use of it.

        When that first fault is a content fault (:data:`CONTENT_ACTIONS`: ``inject_line``,
        ``split_utf8``, ``delay_newline``), every other matching content fault in the queue applies to the same
        request too (in queue order: e.g. two injected lines in one stream). Connection faults
        (stall, resets, cuts, status…) are never combined: each one takes a request of its own.

        Returns:
            the consumed faults (empty when none matches).
        """
        with self._lock:
            first = next((f for f in self._faults if f.matches(kind, verb, namespace)), None)
            if first is None:
                return []
            taken = [first]
            if first.action in CONTENT_ACTIONS:
                taken += [
                    f
                    for f in self._faults
                    if f is not first and f.action in CONTENT_ACTIONS and f.matches(kind, verb, namespace)
                ]
            for f in taken:
                f.count -= 1
            self._faults = [f for f in self._faults if f.count > 0]
            return taken

    def pending(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
