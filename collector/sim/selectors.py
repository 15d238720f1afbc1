"""Label and field selectors as the apiserver parses and applies them.

Label selector grammar (k8s.io/apimachinery ``labels.Parse``): comma-separated requirements
``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists), ``!k``
(does not exist). Field selectors (``fields.ParseSelector``): ``f=v``, ``f==v``, ``f!=v``
joined by commas; the field label must be selectable for the kind, else HTTP 400
``field label not supported: <label>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collector.sim.kinds import KindInfo


class SelectorError(ValueError):
    """A selector that the server rejects with 400 BadRequest; the message is the Status message."""


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label too
        return self.key not in labels or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([^\s!=()]+)\s+(in|notin)\s*\(([^()]*)\)$")
_EQ_RE = re.compile(r"^([^\s!=()]+)\s*(==|=|!=)\s*([^\s=!(),]*)$")
_KEY_RE = re.compile(r"^(!?)\s*([^\s!=(),]+)$")


def parse_label_selector(text: str | None) -> tuple[LabelRequirement, ...]:
    """Parse a ``labelSelector`` query value.

    Returns:
        requirements, all of which must match (empty tuple = everything).

    Raises:
        SelectorError: malformed selector (400).
    """
    if not text:
        return ()
    reqs = []
    for part in _split_top_level(text):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(LabelRequirement(m.group(1), m.group(2), values))
        elif m := _EQ_RE.match(part):
            op = "!=" if m.group(2) == "!=" else "="
            reqs.append(LabelRequirement(m.group(1), op, (m.group(3),)))
        elif m := _KEY_RE.match(part):
            reqs.append(LabelRequirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")
    return tuple(reqs)


@dataclass(frozen=True)
class FieldRequirement:
    label: str
    op: str  # "=" or "!="
    value: str


def parse_field_selector(text: str | None, info: KindInfo) -> tuple[FieldRequirement, ...]:
    """Parse a ``fieldSelector`` query value and check each label is selectable for ``info``.

    Raises:
        SelectorError: malformed term, or ``field label not supported: <label>`` (both 400).
    """
    if not text:
        return ()
    reqs = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        label, op, value = m.group(1), m.group(2), m.group(3).strip()
        if label not in info.selectable_fields():
            raise SelectorError(f"field label not supported: {label}")
        reqs.append(FieldRequirement(label, "!=" if op == "!=" else "=", value))
    return tuple(reqs)


@dataclass(frozen=True)
class Filter:
    """A watch/list filter: namespace (for namespaced paths) plus label and field requirements."""

    info: KindInfo
    namespace: str | None = None
    labels: tuple[LabelRequirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    @property
    def has_selectors(self) -> bool:
        return bool(self.labels or self.fields)

    def matches(self, obj: dict | None) -> bool:
        """Whether the v1-shape ``obj`` is in this selection (``None`` never is)."""
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        for r in self.fields:
            actual = self.info.field_value(obj, r.label)
            if (actual == r.value) != (r.op == "="):
                return False
        return True
