"""The rule every command that states facts of a period applies to its end: the period has ended.

A pack (``reports.render``) and a policy evaluation (``draudit policy eval``) state what was
observed in ``[from, to)``. A ``to`` in the future would state hours that have not happened: a
pack would count them as "collector not running", an evaluation would store findings over an
interval nobody observed (an allocation open at the last observation, clipped into a period that
starts after it, is the empty interval ``[from, from]``). The scheduler's own evaluation of the
current UTC day (``collector.scheduler``) is the one caller that evaluates a period still running:
its facts end at the last observation (``collector.policy.facts``), and it does not go through here.
"""

from __future__ import annotations

from datetime import datetime, timezone


def _rfc3339(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def future_end_error(period_to: datetime, now: datetime, what: str) -> str | None:
    """The one-line refusal when ``period_to`` (aware) lies after ``now`` (aware), else None.

    ``what`` says what covers only ended periods (``"a pack"``, ``"an evaluation"``). The message
    names ``--to``, the current time (whole seconds, UTC) and the latest ``--to`` to give instead.
    """
    if period_to <= now:
        return None
    latest = now.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"--to {_rfc3339(period_to)} is in the future (now {latest}): {what} covers a period that has "
            f"ended; give --to {latest} or earlier (for a whole day, the day after it has ended)")
