"""Allocation timeline and sharing analysis per physical GPU (pure functions, no I/O).

Input is one ``Bar`` per allocation result in the period (from the allocation-episodes population).
``sharing_segments`` finds when two or more claims held devices of one physical GPU at the same
time, who they belonged to, and whether hardware partitioning (distinct MIG devices) separated
them. ``timeline_svgs`` draws the allocation timeline as inline SVG: one lane per physical GPU,
one bar per claim coloured by tenant, MIG slices in their own sub-rows with a dashed outline.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Iterable, Sequence

from collector.timeutil import ns_to_rfc3339

# Okabe–Ito colour-blind-safe palette, then a few more distinct hues; cycles beyond.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F", "#17BECF", "#BCBD22"]
LANES_PER_CHART = 30


@dataclass(frozen=True)
class Bar:
    """One allocation result on a physical GPU: [from_ns, to_ns) with ``to_ns`` None while still allocated."""

    physical_gpu_uuid: str
    node_name: str | None
    device_key: str  # driver/pool/device
    device_type: str | None  # gpu | mig | None (unknown)
    device_uuid: str | None
    mig_profile: str | None
    tenant: str
    namespace: str
    claim_name: str
    claim_uid: str
    from_ns: int
    to_ns: int | None
    admin_access: bool = False

    @property
    def is_mig(self) -> bool:
        return self.device_type == "mig" or bool(self.mig_profile)


def tenant_colours(tenants: Iterable[str]) -> dict[str, str]:
    """Tenant → colour, by sorted tenant name (stable for the same set of tenants)."""
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(sorted(set(tenants)))}


@dataclass(frozen=True)
class SharingSegment:
    """A maximal interval in which the same set of ≥ 2 claims held devices of one physical GPU.

    ``partitioned`` is True when every claim held distinct MIG devices (hardware partitioning);
    False when two claims held the same device or a claim held the whole GPU next to others.
    """

    physical_gpu_uuid: str
    node_name: str | None
    from_ns: int
    to_ns: int
    claims: tuple[str, ...]  # namespace/name, sorted
    tenants: tuple[str, ...]
    devices: tuple[str, ...]
    partitioned: bool

    @property
    def cross_tenant(self) -> bool:
        return len(self.tenants) > 1

    @property
    def mode(self) -> str:
        if self.partitioned:
            return "MIG-partitioned"
        return "shared device (no hardware partitioning)"

    def row(self) -> dict:
        return {"physical_gpu_uuid": self.physical_gpu_uuid, "node_name": self.node_name,
                "from": ns_to_rfc3339(self.from_ns), "to": ns_to_rfc3339(self.to_ns), "from_ns": self.from_ns,
                "to_ns": self.to_ns, "duration_s": round((self.to_ns - self.from_ns) / 1e9, 3),
                "tenants": ";".join(self.tenants), "cross_tenant": self.cross_tenant, "mode": self.mode,
                "claims": ";".join(self.claims), "devices": ";".join(self.devices)}


SHARING_COLUMNS = ("physical_gpu_uuid", "node_name", "from", "to", "from_ns", "to_ns", "duration_s", "tenants",
                   "cross_tenant", "mode", "claims", "devices")


def sharing_segments(bars: Sequence[Bar], period_from_ns: int, period_to_ns: int) -> list[SharingSegment]:
    """Intervals where ≥ 2 distinct claims held devices of the same physical GPU, clipped to the period.

    Admin-access allocations (monitoring, ``adminAccess: true``) do not count as use. Consecutive
    sub-intervals with the same claims are merged. Ordered by GPU, then start.
    """
    by_gpu: dict[str, list[Bar]] = {}
    for b in bars:
        if not b.admin_access:
            by_gpu.setdefault(b.physical_gpu_uuid, []).append(b)
    out: list[SharingSegment] = []
    for gpu in sorted(by_gpu):
        gbars = by_gpu[gpu]
        clipped = [(max(b.from_ns, period_from_ns), min(b.to_ns if b.to_ns is not None else period_to_ns, period_to_ns), b)
                   for b in gbars]
        clipped = [c for c in clipped if c[1] > c[0]]
        points = sorted({p for s, e, _ in clipped for p in (s, e)})
        current: SharingSegment | None = None
        for s, e in zip(points, points[1:]):
            active = [b for bs, be, b in clipped if bs <= s and be >= e]
            claims = {b.claim_uid for b in active}
            if len(claims) < 2:
                if current:
                    out.append(current)
                    current = None
                continue
            devices = [b.device_key for b in active]
            partitioned = all(b.is_mig for b in active) and len(set(devices)) == len(devices) and \
                all(len({x.claim_uid for x in active if x.device_key == d}) == 1 for d in devices)
            seg = SharingSegment(gpu, active[0].node_name, s, e,
                                 tuple(sorted({f"{b.namespace}/{b.claim_name}" for b in active})),
                                 tuple(sorted({b.tenant for b in active})), tuple(sorted(set(devices))), partitioned)
            if current and current.to_ns == s and (current.claims, current.devices) == (seg.claims, seg.devices):
                current = SharingSegment(gpu, current.node_name, current.from_ns, e, seg.claims, seg.tenants,
                                         seg.devices, seg.partitioned)
            else:
                if current:
                    out.append(current)
                current = seg
        if current:
            out.append(current)
    return out


# Tick steps in ns: 1-2-5 below a minute, then clock-friendly steps up to weeks.
_SECOND = 1_000_000_000
TICK_STEPS_NS = tuple(m * 10**e for e in range(6, 10) for m in (1, 2, 5)) + tuple(s * _SECOND for s in (
    10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86_400, 2 * 86_400,
    7 * 86_400, 14 * 86_400, 28 * 86_400))
MAX_TICKS = 8


def axis_ticks(t0_ns: int, t1_ns: int, max_ticks: int = MAX_TICKS) -> tuple[int, list[tuple[int, str]]]:
    """(step in ns, [(tick time in ns, label)]) for a UTC time axis over ``[t0_ns, t1_ns]``.

    The step is the smallest of ``TICK_STEPS_NS`` giving at most ``max_ticks`` ticks; ticks sit on
    multiples of the step (UTC midnight-aligned), so labels are round and all distinct. Labels
    carry only the precision the step needs (``HH:MM:SS.mmm`` below a second, ``HH:MM:SS`` below a
    minute, ``HH:MM`` below a day, the date from a day up); the date is prefixed to the first tick
    and to every tick on a new UTC day.
    """
    span = max(t1_ns - t0_ns, 1)
    step = next((s for s in TICK_STEPS_NS if span // s <= max_ticks), None)
    if step is None:  # beyond the table: whole days
        step = -(-span // (max_ticks * 86_400 * _SECOND)) * 86_400 * _SECOND
    first = -(-t0_ns // step) * step
    ticks: list[tuple[int, str]] = []
    previous_day = None
    for t in range(first, t1_ns + 1, step):
        text = ns_to_rfc3339(t - t % _SECOND) or ""
        day, clock = text[:10], text[11:19]
        if step >= 86_400 * _SECOND:
            label = day
        else:
            clock = f"{clock}.{t % _SECOND // 1_000_000:03d}" if step < _SECOND else \
                clock if step < 60 * _SECOND else clock[:5]
            label = clock if day == previous_day else f"{day} {clock}"
        previous_day = day
        ticks.append((t, label))
    return step, ticks


def step_text(step_ns: int) -> str:
    """A tick step in words: ``500 ms``, ``15 s``, ``5 min``, ``6 h``, ``2 days``."""
    for unit_ns, unit in ((86_400 * _SECOND, "day"), (3600 * _SECOND, "h"), (60 * _SECOND, "min"), (_SECOND, "s"),
                          (1_000_000, "ms")):
        if step_ns >= unit_ns and step_ns % unit_ns == 0:
            n = step_ns // unit_ns
            return f"{n} {unit}{'s' if unit == 'day' and n > 1 else ''}"
    return f"{step_ns} ns"


def timeline_svgs(bars: Sequence[Bar], period_from_ns: int, period_to_ns: int,
                  lanes_per_chart: int = LANES_PER_CHART) -> list[str]:
    """SVG documents (text) drawing the allocation timeline; one chart per ``lanes_per_chart`` GPUs.

    Lanes are ordered by node then GPU UUID; inside a lane, whole-GPU allocations use the first row
    and each MIG device has its own row (dashed outline). Bars are clipped to the period; their
    ``<title>`` names the tenant, claim, device and interval. All text is XML-escaped.
    """
    colours = tenant_colours(b.tenant for b in bars)
    lanes: dict[str, list[Bar]] = {}
    nodes: dict[str, str] = {}
    for b in bars:
        lanes.setdefault(b.physical_gpu_uuid, []).append(b)
        nodes.setdefault(b.physical_gpu_uuid, b.node_name or "")
    order = sorted(lanes, key=lambda g: (nodes[g], g))
    charts = [order[i:i + lanes_per_chart] for i in range(0, len(order), lanes_per_chart)] or [[]]
    return [_chart(chunk, lanes, nodes, colours, period_from_ns, period_to_ns) for chunk in charts]


def _chart(gpus: list[str], lanes: dict[str, list[Bar]], nodes: dict[str, str], colours: dict[str, str],
           t0: int, t1: int) -> str:
    label_w, plot_w, row_h, pad = 250.0, 700.0, 12.0, 6.0
    span = max(t1 - t0, 1)

    def x(ns: int) -> float:
        return label_w + plot_w * (min(max(ns, t0), t1) - t0) / span

    parts: list[str] = []
    y = 28.0
    for gpu in gpus:
        gbars = lanes[gpu]
        mig_rows = sorted({b.device_uuid or b.device_key for b in gbars if b.is_mig})
        has_whole = any(not b.is_mig for b in gbars)
        rows = (["whole"] if has_whole else []) + mig_rows
        lane_h = row_h * len(rows) + pad
        parts.append(f'<rect x="0" y="{y:.1f}" width="{label_w + plot_w:.1f}" height="{lane_h:.1f}" fill="#f6f6f6" '
                     f'stroke="#dddddd" stroke-width="0.5"/>')
        mig_note = f" · MIG ×{len(mig_rows)}" if mig_rows else ""
        parts.append(f'<text x="4" y="{y + 10:.1f}" font-size="8" font-family="DejaVu Sans Mono, monospace">'
                     f'{escape(gpu)}</text>')
        parts.append(f'<text x="4" y="{y + 19:.1f}" font-size="7" fill="#555555">{escape(nodes[gpu])}{escape(mig_note)}</text>')
        for b in sorted(gbars, key=lambda b: (b.from_ns, b.claim_uid, b.device_key)):
            row = rows.index(b.device_uuid or b.device_key) if b.is_mig else 0
            end = b.to_ns if b.to_ns is not None else t1
            if end <= t0 or b.from_ns >= t1:
                continue
            bx, bw = x(b.from_ns), max(x(end) - x(b.from_ns), 1.0)
            by = y + pad / 2 + row * row_h
            style = 'stroke="#222222" stroke-width="0.8" stroke-dasharray="2,1"' if b.is_mig else \
                'stroke="#ffffff" stroke-width="0.4"'
            opacity = "0.35" if b.admin_access else "0.9"
            title = (f"{b.tenant}: {b.namespace}/{b.claim_name} on {b.device_key}"
                     f"{' (' + b.mig_profile + ')' if b.mig_profile else ''} "
                     f"{ns_to_rfc3339(b.from_ns)} – {ns_to_rfc3339(b.to_ns) or 'still allocated'}")
            parts.append(f'<rect x="{bx:.2f}" y="{by:.2f}" width="{bw:.2f}" height="{row_h - 2:.1f}" '
                         f'fill="{colours[b.tenant]}" fill-opacity="{opacity}" {style}>'
                         f'<title>{escape(title)}</title></rect>')
        y += lane_h + 2
    step, ticks = axis_ticks(t0, t1)
    axis = [f'<line x1="{label_w}" y1="20" x2="{label_w + plot_w}" y2="20" stroke="#333333" stroke-width="0.6"/>']
    for tick, label in ticks:
        tx = x(tick)
        anchor = "start" if tx - label_w < 15 else ("end" if label_w + plot_w - tx < 15 else "middle")
        axis.append(f'<line x1="{tx:.1f}" y1="17" x2="{tx:.1f}" y2="{y:.1f}" stroke="#bbbbbb" stroke-width="0.3"/>')
        day, _, clock = label.rpartition(" ")  # a new UTC day's date goes on a row above the clock time
        if day:
            axis.append(f'<text x="{tx:.1f}" y="5.5" font-size="6" fill="#555555" text-anchor="{anchor}">'
                        f'{escape(day)}</text>')
        axis.append(f'<text x="{tx:.1f}" y="13" font-size="7" text-anchor="{anchor}">{escape(clock)}</text>')
    axis.append(f'<text x="4" y="13" font-size="7" fill="#555555">GPU UUID / node · time UTC, grid every '
                f'{escape(step_text(step))}</text>')
    height = y + 4
    if not gpus:
        axis.append(f'<text x="{label_w}" y="40" font-size="9">No allocations in the period.</text>')
        height = 50
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {label_w + plot_w:.0f} {height:.0f}" '
            f'width="100%" role="img" aria-label="Allocation timeline per physical GPU" '
            f'font-family="DejaVu Sans, sans-serif">' + "".join(axis + parts) + "</svg>")


def legend(bars: Sequence[Bar]) -> list[tuple[str, str]]:
    """(tenant, colour) pairs for the legend, sorted by tenant."""
    return sorted(tenant_colours(b.tenant for b in bars).items())
