"""Scenario driver: play a timeline of cluster writes and faults against a FakeApiServer.

A scenario is a list of :class:`Step` ``(at_s, op, payload)``; ``at_s`` is seconds from the
start of the play. Operations:

=============  ==========================================================================
``apply``      payload: the object (v1 shape) → ``srv.apply``
``delete``     payload: ``{kind, name, namespace?, grace_period_s?}`` → ``srv.delete``
``compact``    no payload → ``srv.compact()``
``restart``    no payload → ``srv.restart()``
``bookmark``   payload: kind or None → ``srv.send_bookmark(kind)``
``fault``      payload: a :class:`~collector.sim.faults.Fault` or its mapping → ``srv.add_fault``
``bump``       payload: n → ``srv.bump_rv(n)`` (unrelated etcd writes)
=============  ==========================================================================

The same timeline can be written in YAML or JSON (``load_steps``)::

    - {at: 0.0, op: apply, object: {apiVersion: resource.k8s.io/v1, kind: DeviceClass, ...}}
    - {at: 1.5, op: delete, kind: ResourceClaim, name: c1, namespace: ml}
    - {at: 2.0, op: fault, fault: {kind: ResourceClaim, verb: watch, action: reset_mid_stream}}
    - {at: 3.0, op: bookmark, kind: Pod}
    - {at: 4.0, op: compact}

:func:`claim_lifecycle_steps` builds the template-generated claim lifecycle of dra-api.md §2.6.
The object builders of :mod:`collector.sim.dra_objects` are re-exported here.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from collector.sim.dra_objects import (  # noqa: F401 - re-exported for scenario authors
    DELETE_PROTECTION_FINALIZER,
    NVIDIA_GPU_DRIVER,
    add_finalizer,
    allocate,
    bind_pod,
    claim_spec,
    deallocate,
    make_claim,
    make_claim_from_template,
    make_claim_template,
    make_device_class,
    make_gpu_device,
    make_mig_device,
    make_pod,
    make_slice,
    pod_finished,
    pod_running,
    remove_finalizer,
    reserve,
    set_claim_statuses,
    unreserve,
)
from collector.sim.faults import Fault
from collector.sim.registry import timestamp

OPS = ("apply", "delete", "compact", "restart", "bookmark", "fault", "bump")


@dataclass(frozen=True)
class Step:
    """One timeline entry.

    Attributes:
        at_s: seconds after the start of :func:`play` (>= 0, non-decreasing along a scenario).
        op: one of :data:`OPS`.
        payload: per ``op`` (see the module docstring).
    """

    at_s: float
    op: str
    payload: Any = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"Step op {self.op!r}: use one of {OPS}")
        if self.at_s < 0:
            raise ValueError(f"Step at_s={self.at_s}: must be >= 0")


def _step_from_mapping(data: dict, where: str) -> Step:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a step must be a mapping, got {type(data).__name__}")
    op = data.get("op")
    at = data.get("at", data.get("at_s"))
    if at is None:
        raise ValueError(f"{where}: missing 'at' (seconds from the start)")
    if op == "apply":
        if not isinstance(data.get("object"), dict):
            raise ValueError(f"{where}: op 'apply' needs an 'object' mapping")
        payload: Any = data["object"]
    elif op == "delete":
        missing = [k for k in ("kind", "name") if not data.get(k)]
        if missing:
            raise ValueError(f"{where}: op 'delete' needs {missing}")
        payload = {k: data[k] for k in ("kind", "name", "namespace", "grace_period_s") if k in data}
    elif op == "fault":
        if not isinstance(data.get("fault"), dict):
            raise ValueError(f"{where}: op 'fault' needs a 'fault' mapping")
        try:
            payload = Fault.from_dict(data["fault"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    elif op == "bookmark":
        payload = data.get("kind")
    elif op == "bump":
        payload = int(data.get("n", 1))
    elif op in ("compact", "restart"):
        payload = None
    else:
        raise ValueError(f"{where}: op {op!r}: use one of {OPS}")
    return Step(float(at), op, payload)


def load_steps(source: str | Path | list) -> list[Step]:
    """Read a scenario from a YAML/JSON file path, YAML/JSON text, or a parsed list.

    Accepts a list of step mappings or a mapping with a ``steps`` list.

    Raises:
        ValueError: malformed step (the message names the step index and the problem).
        FileNotFoundError: a path that does not exist.
    """
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml", ".json"))):
        text = Path(source).read_text(encoding="utf-8")
        data = json.loads(text) if str(source).endswith(".json") else yaml.safe_load(text)
    elif isinstance(source, str):
        data = yaml.safe_load(source)  # YAML is a superset of JSON
    else:
        data = source
    if isinstance(data, dict) and "steps" in data:
        data = data["steps"]
    if not isinstance(data, list):
        raise ValueError("scenario: expected a list of steps (or a mapping with 'steps')")
    steps = [s if isinstance(s, Step) else _step_from_mapping(s, f"scenario step {i}") for i, s in enumerate(data)]
    _check_order(steps)
    return steps


def dump_steps(steps: Iterable[Step]) -> list[dict]:
    """Steps → plain mappings (the inverse of :func:`load_steps`), ready for ``yaml.safe_dump``."""
    out = []
    for s in steps:
        d: dict = {"at": s.at_s, "op": s.op}
        if s.op == "apply":
            d["object"] = copy.deepcopy(s.payload)
        elif s.op == "delete":
            d.update(copy.deepcopy(s.payload))
        elif s.op == "fault":
            f: Fault = s.payload
            params = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for k, v in f.params.items() if v is not None}
            d["fault"] = {"kind": f.kind, "verb": f.verb, "action": f.action, "count": f.count, **params}
            if f.namespace:
                d["fault"]["namespace"] = f.namespace
        elif s.op == "bookmark" and s.payload:
            d["kind"] = s.payload
        elif s.op == "bump":
            d["n"] = s.payload
        out.append(d)
    return out


def _check_order(steps: list[Step]) -> None:
    for i in range(1, len(steps)):
        if steps[i].at_s < steps[i - 1].at_s:
            raise ValueError(f"scenario step {i}: at={steps[i].at_s} is before step {i - 1} (at={steps[i - 1].at_s})")


def run_step(srv, step: Step) -> Any:
    """Apply one step to ``srv`` now; returns what the server call returned."""
    if step.op == "apply":
        return srv.apply(step.payload)
    if step.op == "delete":
        p = step.payload
        return srv.delete(p["kind"], p["name"], p.get("namespace"), grace_period_s=p.get("grace_period_s"))
    if step.op == "compact":
        return srv.compact()
    if step.op == "restart":
        return srv.restart()
    if step.op == "bookmark":
        return srv.send_bookmark(step.payload)
    if step.op == "fault":
        fault = step.payload if isinstance(step.payload, Fault) else Fault.from_dict(step.payload)
        return srv.add_fault(fault)
    if step.op == "bump":
        return srv.bump_rv(int(step.payload or 1))
    raise ValueError(f"unknown op {step.op!r}")


def play(
    srv,
    steps: Iterable[Step],
    speed: float = 1.0,
    on_step: Callable[[Step, Any], None] | None = None,
    stop: threading.Event | None = None,
) -> list[Any]:
    """Play ``steps`` against ``srv``, sleeping until each step's time.

    Args:
        speed: time scale (2.0 = twice as fast); 0 = no sleeping at all.
        on_step: called after each step with ``(step, result)``.
        stop: when set (from another thread), the play ends before the next step.

    Returns:
        the result of every step played, in order.

    Raises:
        ValueError: negative speed or steps out of time order.
    """
    if speed < 0:
        raise ValueError(f"play speed={speed}: must be >= 0")
    steps = list(steps)
    _check_order(steps)
    start = time.monotonic()
    results = []
    for step in steps:
        if speed > 0:
            delay = start + step.at_s / speed - time.monotonic()
            if delay > 0:
                if stop is not None:
                    if stop.wait(delay):
                        break
                else:
                    time.sleep(delay)
        if stop is not None and stop.is_set():
            break
        result = run_step(srv, step)
        results.append(result)
        if on_step is not None:
            on_step(step, result)
    return results


def claim_lifecycle_steps(
    pod_name: str = "trainer-0",
    namespace: str = "default",
    node: str = "node-a",
    devices: Iterable[tuple[str, str]] = (("gpu", "gpu-0"),),
    template: dict | None = None,
    *,
    pod_claim_name: str = "gpu",
    driver: str = "gpu.nvidia.com",
    start_s: float = 0.0,
    gap_s: float = 0.2,
    run_s: float = 1.0,
    pod_uid: str | None = None,
    claim_suffix: str | None = None,
    include_template: bool = False,
    delete_pod: bool = False,
    base_time: datetime | None = None,
) -> list[Step]:
    """The template-generated claim lifecycle of dra-api.md §2.6 as timeline steps.

    Writes, ``gap_s`` apart (the pod runs ``run_s``): pod ADDED → claim ADDED → pod
    ``resourceClaimStatuses`` → claim finalizer → claim allocation + reservedFor (one write)
    → pod ``nodeName`` + PodScheduled → pod Running → pod Succeeded → claim status cleared →
    finalizer removed → claim DELETED (→ pod DELETED when ``delete_pod``).

    Args:
        devices: ``(request, device)`` pairs allocated from pool ``node`` of ``driver``.
        template: the ResourceClaimTemplate (default: ``make_claim_template("single-gpu")``);
            applied first when ``include_template``.
        base_time: wall-clock time of ``start_s`` (UTC), for the status timestamps.

    Returns:
        the steps; objects carry pinned uids so owner references hold.
    """
    base = base_time or datetime.now(timezone.utc)
    template = template or make_claim_template("single-gpu", namespace)
    steps: list[Step] = []
    t = start_s

    def at(offset: float) -> str:
        return timestamp(base + timedelta(seconds=offset - start_s))

    if include_template:
        steps.append(Step(t, "apply", template))
        t += gap_s
    pod = make_pod(pod_name, namespace, claim_templates={pod_claim_name: template["metadata"]["name"]}, uid=pod_uid)
    steps.append(Step(t, "apply", pod))
    t += gap_s
    claim = make_claim_from_template(pod, pod_claim_name, template, suffix=claim_suffix)
    steps.append(Step(t, "apply", claim))
    t += gap_s
    pod = set_claim_statuses(pod, {pod_claim_name: claim["metadata"]["name"]})
    steps.append(Step(t, "apply", pod))
    t += gap_s
    claim = add_finalizer(claim)
    steps.append(Step(t, "apply", claim))
    t += gap_s
    claim = allocate(claim, [(req, driver, node, dev) for req, dev in devices], pod, node=node)
    steps.append(Step(t, "apply", claim))
    t += gap_s
    pod = bind_pod(pod, node, at=at(t))
    steps.append(Step(t, "apply", pod))
    t += gap_s
    pod = pod_running(pod, started_at=at(t))
    steps.append(Step(t, "apply", pod))
    t += run_s
    pod = pod_finished(pod, "Succeeded", finished_at=at(t))
    steps.append(Step(t, "apply", pod))
    t += gap_s
    claim = deallocate(claim)
    steps.append(Step(t, "apply", claim))
    t += gap_s
    claim = remove_finalizer(claim)
    steps.append(Step(t, "apply", claim))
    t += gap_s
    steps.append(Step(t, "delete", {"kind": "ResourceClaim", "name": claim["metadata"]["name"], "namespace": namespace}))
    if delete_pod:
        t += gap_s
        steps.append(Step(t, "delete", {"kind": "Pod", "name": pod_name, "namespace": namespace}))
    return steps


def replay_claim_lifecycle(srv, speed: float = 0.0, **kwargs: Any) -> list[Any]:
    """Build :func:`claim_lifecycle_steps` (``**kwargs``) and play them on ``srv`` at ``speed``.

    Returns the written objects, one per step.
    """
    return play(srv, claim_lifecycle_steps(**kwargs), speed=speed)


def wait_caught_up(srv, watcher, timeout_s: float = 30.0) -> None:
    """Block until ``watcher`` has committed everything ``srv`` served up to its current RV.

    Proof is a BOOKMARK at that RV reaching every reflector. Bookmarks go only to watches open at
    that moment (a watch may be reconnecting), so one is sent at every poll.

    Raises:
        TimeoutError: not caught up within ``timeout_s`` seconds.
    """
    target = srv.current_rv
    deadline = time.monotonic() + timeout_s
    while not all(int(r.resume_rv or 0) >= target for r in watcher.reflectors):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the watcher did not catch up with the fake API server (RV {target}) in {timeout_s} s")
        srv.send_bookmark()
        time.sleep(0.05)
    if not watcher.recorder.flush(max(0.1, deadline - time.monotonic())):
        raise TimeoutError("the watcher's recorder did not commit in time")
