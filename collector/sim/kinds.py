"""The resource kinds the fake API server serves: names, scopes, paths and field selectors.

Source of the rules: watch-semantics.md §1 (paths, selectable fields) and dra-api.md §1, §4.1
(versions of ``resource.k8s.io``, ResourceSlice field selectors ``spec.nodeName``/``spec.driver``).
Cluster-scoped kinds only know ``metadata.name`` as a field label, namespaced kinds also
``metadata.namespace`` (apiserver ``generic.ObjectMetaFieldsSet``); anything else is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

RESOURCE_GROUP = "resource.k8s.io"
COORDINATION_GROUP = "coordination.k8s.io"

#: Versions of resource.k8s.io the sim can serve, best first (dra-api.md §1.4: v1 > v1beta2 > v1beta1).
RESOURCE_VERSIONS_BEST_FIRST = ("v1", "v1beta2", "v1beta1")


def _path_value(obj: dict, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _as_field_text(value: Any) -> str:
    """Field-selector text of a value as the apiserver renders it (bools lower case, unset → "")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class KindInfo:
    """One served resource kind.

    Attributes:
        kind: ``ResourceClaim``, ``Pod``…
        group: API group (``""`` for core).
        plural: the URL resource name (``resourceclaims``).
        namespaced: whether objects live in a namespace.
        extra_fields: selectable field labels beyond ``metadata.*`` (dotted paths into the object).
        versions: the group versions this kind exists in (before the server's version filter).
        short_names: discovery ``shortNames``.
    """

    kind: str
    group: str
    plural: str
    namespaced: bool
    extra_fields: tuple[str, ...] = ()
    versions: tuple[str, ...] = ("v1",)
    short_names: tuple[str, ...] = ()
    field_getters: dict[str, Callable[[dict], Any]] = field(default_factory=dict, compare=False, hash=False)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def api_version(self, version: str) -> str:
        """``apiVersion`` text for ``version`` (``v1`` for core, ``group/version`` otherwise)."""
        return version if not self.group else f"{self.group}/{version}"

    def selectable_fields(self) -> tuple[str, ...]:
        base = ("metadata.name", "metadata.namespace") if self.namespaced else ("metadata.name",)
        return base + self.extra_fields

    def field_value(self, obj: dict, label: str) -> str:
        """The text a field selector compares for ``label`` on ``obj`` (v1 shape).

        Raises:
            KeyError: ``label`` is not selectable for this kind (the server answers 400).
        """
        if label not in self.selectable_fields():
            raise KeyError(label)
        getter = self.field_getters.get(label)
        value = getter(obj) if getter else _path_value(obj, label)
        return _as_field_text(value)

    def key(self, namespace: str | None, name: str) -> str:
        """Storage key, ordered like etcd keys: ``ns/name`` for namespaced kinds, ``name`` otherwise."""
        return f"{namespace}/{name}" if self.namespaced else name


_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)

KINDS: dict[str, KindInfo] = {
    k.kind: k
    for k in (
        KindInfo("ResourceClaim", RESOURCE_GROUP, "resourceclaims", True, versions=RESOURCE_VERSIONS_BEST_FIRST),
        KindInfo(
            "ResourceClaimTemplate", RESOURCE_GROUP, "resourceclaimtemplates", True, versions=RESOURCE_VERSIONS_BEST_FIRST
        ),
        KindInfo(
            "ResourceSlice",
            RESOURCE_GROUP,
            "resourceslices",
            False,
            extra_fields=("spec.nodeName", "spec.driver"),
            versions=RESOURCE_VERSIONS_BEST_FIRST,
        ),
        KindInfo("DeviceClass", RESOURCE_GROUP, "deviceclasses", False, versions=RESOURCE_VERSIONS_BEST_FIRST),
        KindInfo(
            "Pod",
            "",
            "pods",
            True,
            extra_fields=_POD_FIELDS,
            short_names=("po",),
            field_getters={"spec.hostNetwork": lambda o: bool(_path_value(o, "spec.hostNetwork"))},
        ),
        KindInfo("Lease", COORDINATION_GROUP, "leases", True),
    )
}

BY_RESOURCE: dict[tuple[str, str], KindInfo] = {(k.group, k.plural): k for k in KINDS.values()}


def kind_info(kind: str) -> KindInfo:
    """Registry lookup by kind name.

    Raises:
        ValueError: unknown kind (names the kinds the sim serves).
    """
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"kind {kind!r} is not served by the sim; use one of {sorted(KINDS)}") from None
