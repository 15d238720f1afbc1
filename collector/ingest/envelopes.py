"""Collector envelopes: where the application line sits and what the shipper says about the pod.

One function per envelope (log-formats.md §2, mapping table §7.2). Each returns an ``Envelope``:
the payload (the application line as text, or an already-merged object) and the Kubernetes
metadata the shipper added. Detection (§7.3 rule 1) looks at key signatures:

==============  ==========================================================================
``cri``         ``<RFC3339Nano> <stdout|stderr> <P|F> <content>`` (kubelet / containerd / CRI-O)
``docker_json`` ``{"log": …, "stream": …, "time": …}`` (json-file driver)
``fluentbit``   ``kubernetes.{namespace_name,pod_name,pod_id,host,container_name,docker_id}``
``fluentd``     the same plus ``docker.container_id`` / ``kubernetes.namespace_id``/``master_url``
``vector``      ``kubernetes.{pod_namespace,pod_uid,pod_node_name}``, ``source_type``, ``file``
``elastic``     Filebeat / Elastic Agent: ``kubernetes.pod.{name,uid}``, ``container.id``, ``agent``
``none``        the line is the application's own JSON
==============  ==========================================================================

Pod UIDs are only taken from what the envelope carries (metadata or a ``/var/log/pods/…`` path);
the lineage stage resolves the rest from pod history.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from collector.ingest import timestamps
from collector.ingest.jsondoc import flatten

ENVELOPES = ("none", "cri", "docker_json", "fluentbit", "fluentd", "vector", "elastic", "otlp_filelog", "otlp_app")

CRI_LINE = re.compile(r"^(\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-]\d{2}:?\d{2})) (stdout|stderr) ([PF])(?: (.*))?$", re.S)
# /var/log/pods/<namespace>_<pod-name>_<pod-uid>/<container>/<restart-count>.log
_PODS_PATH = re.compile(r"/var/log/pods/([^_/]+)_([^_/]+)_([0-9a-fA-F-]{36})/([^/]+)/(\d+)\.log")
# /var/log/containers/<pod-name>_<namespace>_<container>-<container-id-64hex>.log
_CONTAINERS_PATH = re.compile(r"/var/log/containers/([^_/]+)_([^_/]+)_(.+)-([0-9a-f]{64})\.log")
_RUNTIME_PREFIX = re.compile(r"^[a-z0-9-]+://")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

# Keys a Fluent Bit / Fluentd record carries besides the application's own.
_FLUENT_KEYS = frozenset({"date", "time", "stream", "_p", "logtag", "log", "message", "kubernetes",
                          "kubernetes_namespace", "docker"})
_MERGE_LOG_KEY_GUESSES = ("log_processed", "app", "json", "parsed", "data")
_VECTOR_KEYS = frozenset({"timestamp", "stream", "file", "source_type", "kubernetes", "message", "_partial"})
_ELASTIC_PREFIXES = ("kubernetes.", "container.", "agent.", "input.", "data_stream.", "orchestrator.",
                     "cloud.", "host.", "event.", "log.file.", "log.offset", "stream", "@timestamp",
                     "elastic_agent.", "fileset.")


@dataclass
class Envelope:
    """What the shipper wrapped around the application line.

    ``payload`` is the application line (``str``), an object the shipper already parsed
    (``dict``), or None. Times are integer ns (UTC). ``extras`` go to the record's attributes
    under ``envelope.``; ``warnings`` to ``draudit.warnings``.
    """

    kind: str
    payload: Any = None
    runtime_time_ns: int | None = None
    runtime_precision_ns: int = 1
    stream: str | None = None
    partial: bool = False
    namespace: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None
    container_name: str | None = None
    node_name: str | None = None
    container_id: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The object the shipper already decoded from a text ``payload`` (Fluent Bit ``Merge_Log_Key``
    # with ``Keep_Log On`` carries both); the parser uses it instead of decoding the text again
    # only when it re-encodes to exactly that text (``LineParser._same_as_merged``).
    merged: dict[str, Any] | None = None

    def fill_from_path(self, path: str | None) -> None:
        """Fill missing pod identity from a kubelet log path (``/var/log/pods`` carries the UID)."""
        if not path:
            return
        m = _PODS_PATH.search(path)
        if m:
            ns, pod, uid, container, restarts = m.groups()
            self.namespace = self.namespace or ns
            self.pod_name = self.pod_name or pod
            self.pod_uid = self.pod_uid or uid.lower()
            self.container_name = self.container_name or container
            self.extras.setdefault("restart_count", int(restarts))
            return
        m = _CONTAINERS_PATH.search(path)
        if m:
            pod, ns, container, cid = m.groups()
            self.namespace = self.namespace or ns
            self.pod_name = self.pod_name or pod
            self.container_name = self.container_name or container
            self.container_id = self.container_id or cid

    def fill_from_link_target(self, target: str | None) -> None:
        """Fill the pod UID and restart count from the ``/var/log/pods/…`` file a
        ``/var/log/containers/…`` symlink points to (kubelet makes one for each container log; the
        link's own name has no UID). Only when the target names the same namespace, pod and
        container as the identity already filled: a link elsewhere gives nothing (never a guess)."""
        m = _PODS_PATH.search(target) if target else None
        if m is None:
            return
        ns, pod, uid, container, restarts = m.groups()
        if (self.namespace, self.pod_name, self.container_name) != (ns, pod, container):
            return
        self.pod_uid = self.pod_uid or uid.lower()
        self.extras.setdefault("restart_count", int(restarts))


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) and value != "" else None


def normalise_container_id(value: Any) -> str | None:
    """Strip the runtime prefix (``containerd://``, ``docker://``, ``cri-o://``) and lowercase."""
    text = _s(value)
    return _RUNTIME_PREFIX.sub("", text).lower() if text else None


def normalise_pod_uid(value: Any) -> str | None:
    """Lower-case UUID text, or None when absent or not UUID-shaped."""
    text = _s(value)
    if not text:
        return None
    text = text.strip().lower()
    return text if _UUID.match(text) else None


def set_pod_uid(env: Envelope, value: Any, name: str) -> None:
    """``env.pod_uid`` from the envelope's field ``name`` (``normalise_pod_uid``); a value that is
    there but is not a UUID is ignored with a warning (the pod is then looked up by namespace and
    name), not silently."""
    env.pod_uid = normalise_pod_uid(value)
    if env.pod_uid is None and value not in (None, ""):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        env.warnings.append(f"envelope {name} {shown} is not a pod UID (a UUID); ignored")


def _runtime_time(env: Envelope, value: Any, default_tz: str | None = "UTC") -> None:
    if value is None:
        return
    try:
        env.runtime_time_ns, env.runtime_precision_ns = timestamps.parse_any(value, default_tz)
    except timestamps.BadTimestamp as exc:
        env.warnings.append(f"envelope time unreadable: {exc}")


# -- CRI ------------------------------------------------------------------------------------------


def cri(match: re.Match[str], source: str | None) -> Envelope:
    """A CRI line already matched by ``CRI_LINE``; pod identity from the file path when it has one."""
    ts, stream, tag, content = match.groups()
    env = Envelope("cri", payload=content or "", stream=stream, partial=(tag == "P"))
    try:
        env.runtime_time_ns, env.runtime_precision_ns = timestamps.parse_iso(ts)
    except timestamps.BadTimestamp as exc:
        env.warnings.append(f"CRI time unreadable: {exc}")
    env.fill_from_path(source)
    return env


# -- JSON envelopes ---------------------------------------------------------------------------------


# Keys of Fluent Bit's kubernetes filter map (any one, beside a ``log`` string, marks its record).
_FLUENT_K8S_KEYS = ("pod_name", "container_name", "host", "container_image", "container_hash", "labels", "annotations")


def detect(doc: dict[str, Any]) -> str:
    """The envelope kind of a decoded JSON line (``none`` when it is the application's own record)."""
    k8s = doc.get("kubernetes")
    if isinstance(k8s, dict):
        if "pod_namespace" in k8s or "pod_uid" in k8s or "pod_node_name" in k8s:
            return "vector"
        if "namespace_name" in k8s or "pod_id" in k8s or "docker_id" in k8s or (
                "pod_name" in k8s and "container_name" in k8s):
            docker = doc.get("docker")
            if (isinstance(docker, dict) and "container_id" in docker) or "namespace_id" in k8s or "master_url" in k8s:
                return "fluentd"
            return "fluentbit"
        if isinstance(k8s.get("pod"), dict) or isinstance(k8s.get("container"), dict) or "namespace" in k8s:
            return "elastic"
        if isinstance(doc.get("log"), str) and any(k in k8s for k in _FLUENT_K8S_KEYS):
            return "fluentbit"  # the kubernetes filter with part of its metadata (no pod name, no namespace)
    if doc.get("source_type") == "kubernetes_logs":
        return "vector"
    agent, inp, log = doc.get("agent"), doc.get("input"), doc.get("log")
    if (isinstance(agent, dict) and agent.get("type") in ("filebeat", "elastic-agent")) or (
            isinstance(inp, dict) and "type" in inp and isinstance(log, dict) and "file" in log):
        return "elastic"
    if "log" in doc and "time" in doc and set(doc) <= {"log", "stream", "time", "attrs"}:
        return "docker_json"
    if ("_p" in doc or "logtag" in doc or ("date" in doc and "stream" in doc)) and ("log" in doc or "message" in doc):
        return "fluentbit"  # tail + CRI parser without the kubernetes filter
    return "none"


def _looks_like_app(obj: dict[str, Any], app_keys: frozenset[str]) -> bool:
    return any(k in obj for k in app_keys)


def fluent(doc: dict[str, Any], kind: str, dups: dict[str, list[Any]], app_keys: frozenset[str]) -> Envelope:
    """Fluent Bit (``tail`` + ``kubernetes`` filter) or Fluentd (``kubernetes_metadata``) record.

    Payload, in order: the raw ``log`` string (``Keep_Log On``; exact application line), else a
    ``Merge_Log_Key`` sub-map, else the keys ``Merge_Log`` appended at top level, else ``message``
    (classic CRI regex parser). With ``Merge_Log`` + ``Keep_Log`` and a Spring 3.5 nested ECS line,
    ``log`` appears twice (raw string, then the application's ``log`` object); that pair is
    reconciled here when the string's own ``log`` member equals the object (log-formats.md §2.2).

    ``dups`` are the top-level duplicate keys (first value kept in ``doc``); any other disagreement
    is left for the caller to quarantine.
    """
    env = Envelope(kind)
    k8s = doc.get("kubernetes") if isinstance(doc.get("kubernetes"), dict) else {}
    env.namespace = _s(k8s.get("namespace_name"))
    env.pod_name = _s(k8s.get("pod_name"))
    set_pod_uid(env, k8s.get("pod_id"), "pod_id")
    env.node_name = _s(k8s.get("host"))
    env.container_name = _s(k8s.get("container_name"))
    docker = doc.get("docker") if isinstance(doc.get("docker"), dict) else {}
    env.container_id = normalise_container_id(k8s.get("docker_id") or docker.get("container_id"))
    for src, dst in (("container_image", "container_image"), ("pod_ip", "pod_ip"), ("labels", "labels")):
        if k8s.get(src) not in (None, "", {}):
            env.extras[dst] = k8s[src]
    env.stream = _s(doc.get("stream"))
    env.partial = doc.get("_p") == "P" or doc.get("logtag") == "P"
    if "time" in doc:
        _runtime_time(env, doc.get("time"))
    elif "date" in doc:
        _runtime_time(env, doc.get("date"), default_tz="UTC")  # out_http date formats are UTC (§2.2)

    log_values = dups.get("log") or [doc.get("log")]
    raw = next((v for v in log_values if isinstance(v, str)), None)
    merged_log_obj = next((v for v in log_values if isinstance(v, dict)), None)
    if "log" in dups:
        env.extras["_reconcile_log"] = (raw, merged_log_obj)  # checked by the caller after parsing raw
    if raw is not None and (raw.startswith("{") or raw.lstrip().startswith("{")):
        env.payload = raw
        env.merged = next((doc[k] for k in _MERGE_LOG_KEY_GUESSES if isinstance(doc.get(k), dict)), None)
        return env
    merge_key = next((k for k in _MERGE_LOG_KEY_GUESSES if isinstance(doc.get(k), dict)), None)
    if merge_key is None:
        merge_key = next((k for k, v in doc.items() if k not in _FLUENT_KEYS and isinstance(v, dict)
                          and _looks_like_app(v, app_keys)), None)
    if merge_key is not None:
        env.payload = doc[merge_key]
        env.extras["merge_log_key"] = merge_key
        return env
    if raw is None and isinstance(merged_log_obj, dict) and _looks_like_app(merged_log_obj, app_keys):
        # ``log`` arrived already decoded (a parser or nest filter upstream, Fluentd's
        # hash_value_field log): the application record itself, as under Vector's ``message``.
        env.payload = merged_log_obj
        env.extras["log_object"] = True
        return env
    top = {k: v for k, v in doc.items() if k not in _FLUENT_KEYS}
    if isinstance(merged_log_obj, dict):
        top["log"] = merged_log_obj
    if _looks_like_app(top, app_keys):
        if isinstance(doc.get("message"), str) and "log" in doc:
            top["message"] = doc["message"]  # with the CRI multiline parser `message` is the app's
        env.payload = top
        env.extras["merged_top_level"] = True
        return env
    env.payload = raw if raw is not None else doc.get("message") if isinstance(doc.get("message"), (str, dict)) else None
    return env


def vector(doc: dict[str, Any], app_keys: frozenset[str]) -> Envelope:
    """Vector ``kubernetes_logs`` event (as sent by the ``http`` sink, ``json``/``ndjson`` codec).

    With ``auto_partial_merge: false`` Vector leaves a line the runtime split in chunks, each but
    the last marked ``"_partial": true``: a partial chunk, reassembled as a CRI ``P`` chunk is."""
    env = Envelope("vector", partial=doc.get("_partial") is True)
    k8s = doc.get("kubernetes") if isinstance(doc.get("kubernetes"), dict) else {}
    env.namespace = _s(k8s.get("pod_namespace"))
    env.pod_name = _s(k8s.get("pod_name"))
    set_pod_uid(env, k8s.get("pod_uid"), "pod_uid")
    env.node_name = _s(k8s.get("pod_node_name"))
    env.container_name = _s(k8s.get("container_name"))
    env.container_id = normalise_container_id(k8s.get("container_id"))
    for src, dst in (("container_image", "container_image"), ("pod_ip", "pod_ip"), ("pod_labels", "labels"),
                     ("pod_owner", "pod_owner")):
        if k8s.get(src) not in (None, "", {}):
            env.extras[dst] = k8s[src]
    env.stream = _s(doc.get("stream"))
    msg = doc.get("message")
    top = {k: v for k, v in doc.items() if k not in _VECTOR_KEYS}
    stamp = doc.get("timestamp")
    if msg is None and _is_number(stamp) and _gelf_at_root(top):
        # a GELF line merged at the root (and ``.message`` deleted): Vector writes its own timestamp
        # as RFC 3339 text, so a number there is GELF's, which the merge put over Vector's
        top["timestamp"], stamp = stamp, None
    _runtime_time(env, stamp)
    if _s(doc.get("file")):
        env.extras["log_file_path"] = doc["file"]
        env.fill_from_path(doc["file"])
    if isinstance(msg, str) and not msg.lstrip().startswith("{") and _looks_like_app(top, app_keys):
        # ``. = merge(., parse_json!(.message))`` (log-formats §2.4: parse_json in VRL): the
        # application's fields are at the root and its own ``message`` replaced the raw line
        env.payload = {**top, "message": msg}
        env.warnings.append("application fields merged at the root of the Vector event: its message is the "
                            "application's, the raw line is not kept")
    elif isinstance(msg, (str, dict)):
        env.payload = msg
    elif _looks_like_app(top, app_keys) or _gelf_at_root(top):  # GELF's names carry "_": no alias matches them here
        env.payload = top
        env.warnings.append("application fields merged at the root of the Vector event, without a message: "
                            "the raw line is not kept")
    return env


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_gelf(obj: dict[str, Any]) -> bool:
    """GELF 1.1's signature (log-formats §1.4 and §7.3 rule 1: ``version`` "1.1" + ``short_message``),
    ``payloads.detect_format``'s too."""
    return obj.get("version") == "1.1" and "short_message" in obj


def _gelf_at_root(obj: dict[str, Any]) -> bool:
    """A GELF record merged at the root of an envelope: its signature and a text ``short_message``."""
    return is_gelf(obj) and isinstance(obj["short_message"], str)


def elastic(doc: dict[str, Any], app_keys: frozenset[str]) -> Envelope:
    """Filebeat / Elastic Agent event (``add_kubernetes_metadata``, ECS field names, §2.5)."""
    env = Envelope("elastic")
    flat = flatten(doc)
    ns = flat.get("kubernetes.namespace")
    env.namespace = _s(ns) or _s(flat.get("kubernetes.namespace.name"))
    env.pod_name = _s(flat.get("kubernetes.pod.name"))
    set_pod_uid(env, flat.get("kubernetes.pod.uid"), "kubernetes.pod.uid")
    env.node_name = _s(flat.get("kubernetes.node.name"))
    env.container_name = _s(flat.get("kubernetes.container.name"))
    env.container_id = normalise_container_id(flat.get("container.id"))
    if _s(flat.get("container.image.name")):
        env.extras["container_image"] = flat["container.image.name"]
    if _s(flat.get("kubernetes.pod.ip")):
        env.extras["pod_ip"] = flat["kubernetes.pod.ip"]
    labels = {k[len("kubernetes.labels."):]: v for k, v in flat.items() if k.startswith("kubernetes.labels.")}
    if labels:
        env.extras["labels"] = labels
    env.stream = _s(flat.get("stream"))
    _runtime_time(env, flat.get("@timestamp"))
    path = _s(flat.get("log.file.path"))
    if path:
        env.extras["log_file_path"] = path
        env.fill_from_path(path)
    msg = doc.get("message")
    if isinstance(msg, str) and msg.lstrip().startswith("{"):
        env.payload = msg
        return env
    if isinstance(msg, dict) and _looks_like_app(msg, app_keys):  # decode_json_fields with target "message"
        env.payload = msg
        return env
    rest = {k: v for k, v in flat.items() if not k.startswith(_ELASTIC_PREFIXES)}
    if _looks_like_app(rest, app_keys):
        # The pipeline decoded the application JSON to the top level: its @timestamp is the app's.
        if "@timestamp" in flat:
            rest["@timestamp"] = flat["@timestamp"]
        env.payload = rest
        env.extras["decoded_top_level"] = True
        return env
    env.payload = msg if isinstance(msg, str) else None
    return env


def docker_json(doc: dict[str, Any], source: str | None) -> Envelope:
    """Docker ``json-file`` line ``{"log":"…\\n","stream":"stdout","time":"…"}``."""
    env = Envelope("docker_json", stream=_s(doc.get("stream")))
    _runtime_time(env, doc.get("time"))
    log = doc.get("log")
    if isinstance(log, str):
        env.partial = not log.endswith("\n")
        env.payload = log.rstrip("\r\n")
    env.fill_from_path(source)
    return env
