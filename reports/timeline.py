"""Allocation timeline and sharing analysis per physical GPU (pure functions, no I/O).

Input is one ``Bar`` per allocation result in the period (from the allocation-episodes population).
``sharing_segments`` finds when two or more claims held devices of one physical GPU at the same
time, who they belonged to, and whether hardware partitioning (distinct MIG devices) separated
them. ``timeline_svgs`` draws the allocation timeline as inline SVG: one lane per physical GPU,
one bar per claim coloured by tenant, concurrent claims on stacked sub-rows, MIG slices in their
own sub-rows with a dashed outline.
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
ROWS_PER_CHART = 60  # sub-rows per chart: one chart fits an A4 page
MAX_SUB_ROWS = 8  # stacked rows per device group in a lane


@dataclass(frozen=True)
class Bar:
    """One allocation result on a physical GPU: [from_ns, to_ns) with ``to_ns`` None while still allocated.

    ``stopped_at_ns`` is set when the allocation was still open when the collector stopped observing
    (``to_ns`` is then that instant, the last observation): what happened after it is not known.
    """

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
    stopped_at_ns: int | None = None

    @property
    def until_text(self) -> str:
        """The end of the bar in words: a time, ``still allocated``, or open at the last observation."""
        if self.stopped_at_ns is not None:
            return f"open at last observation, collector stopped at {ns_to_rfc3339(self.stopped_at_ns)}"
        return ns_to_rfc3339(self.to_ns) or "still allocated"

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
    ``open_at_last_observation``: the interval ends where the collector stopped observing while
    the claims were still allocated (``to_ns`` is the last observation, not a seen release).
    """

    physical_gpu_uuid: str
    node_name: str | None
    from_ns: int
    to_ns: int
    claims: tuple[str, ...]  # namespace/name, sorted
    tenants: tuple[str, ...]
    devices: tuple[str, ...]
    partitioned: bool
    open_at_last_observation: bool = False
    same_device: bool = False  # two claims held one device (not only different devices of one GPU)

    @property
    def cross_tenant(self) -> bool:
        return len(self.tenants) > 1

    @property
    def mode(self) -> str:
        if self.partitioned:
            return "MIG-partitioned"
        if self.same_device:
            return "shared device (no hardware partitioning)"
        return "different devices of one GPU (no hardware partitioning)"  # e.g. a MIG partition beside the whole GPU

    def row(self) -> dict:
        return {"physical_gpu_uuid": self.physical_gpu_uuid, "node_name": self.node_name,
                "from": ns_to_rfc3339(self.from_ns), "to": ns_to_rfc3339(self.to_ns), "from_ns": self.from_ns,
                "to_ns": self.to_ns, "duration_s": round((self.to_ns - self.from_ns) / 1e9, 3),
                "tenants": ";".join(self.tenants), "cross_tenant": self.cross_tenant, "mode": self.mode,
                "claims": ";".join(self.claims), "devices": ";".join(self.devices),
                "open_at_last_observation": self.open_at_last_observation}


SHARING_COLUMNS = ("physical_gpu_uuid", "node_name", "from", "to", "from_ns", "to_ns", "duration_s", "tenants",
                   "cross_tenant", "mode", "claims", "devices", "open_at_last_observation")


def sharing_segments(bars: Sequence[Bar], period_from_ns: int, period_to_ns: int) -> list[SharingSegment]:
    """Intervals where ≥ 2 distinct claims held devices of the same physical GPU, clipped to the period.

    Admin-access allocations (monitoring, ``adminAccess: true``) do not count as use. Consecutive
    sub-intervals with the same claims are merged. An interval that ends at a bar's
    ``stopped_at_ns`` is flagged ``open_at_last_observation``. Ordered by GPU, then start.
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
            same_device = any(len({x.claim_uid for x in active if x.device_key == d}) > 1 for d in set(devices))
            partitioned = all(b.is_mig for b in active) and len(set(devices)) == len(devices) and not same_device
            seg = SharingSegment(gpu, active[0].node_name, s, e,
                                 tuple(sorted({f"{b.namespace}/{b.claim_name}" for b in active})),
                                 tuple(sorted({b.tenant for b in active})), tuple(sorted(set(devices))), partitioned,
                                 any(b.stopped_at_ns == e for b in active), same_device)
            if current and current.to_ns == s and (current.claims, current.devices) == (seg.claims, seg.devices):
                current = SharingSegment(gpu, current.node_name, current.from_ns, e, seg.claims, seg.tenants,
                                         seg.devices, seg.partitioned, seg.open_at_last_observation, seg.same_device)
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
                  lanes_per_chart: int = LANES_PER_CHART, rows_per_chart: int = ROWS_PER_CHART) -> list[str]:
    """SVG documents (text) drawing the allocation timeline, one lane per physical GPU.

    Lanes are ordered by node then GPU UUID. Inside a lane, whole-GPU allocations come first, then
    each MIG device (dashed outline); claims that overlap in time on the same device get stacked
    sub-rows (``sub_rows``), so a later claim never hides an earlier one that continues. A chart
    holds at most ``lanes_per_chart`` GPUs and ``rows_per_chart`` sub-rows (so it fits one A4 page);
    a lane taller than that gets a chart of its own. Bars are clipped to the period; their
    ``<title>`` names the tenant, claim, device and interval. All text is XML-escaped.
    """
    colours = tenant_colours(b.tenant for b in bars)
    lanes: dict[str, list[Bar]] = {}
    nodes: dict[str, str] = {}
    for b in bars:
        if min(b.to_ns if b.to_ns is not None else period_to_ns, period_to_ns) > max(b.from_ns, period_from_ns):
            lanes.setdefault(b.physical_gpu_uuid, []).append(b)
            nodes.setdefault(b.physical_gpu_uuid, b.node_name or "")
    layouts = {g: lane_rows(lanes[g], period_to_ns) for g in lanes}
    charts: list[list[str]] = [[]]
    rows_in_chart = 0
    for gpu in sorted(lanes, key=lambda g: (nodes[g], g)):
        rows = len(layouts[gpu][1])
        if charts[-1] and (len(charts[-1]) >= lanes_per_chart or rows_in_chart + rows > rows_per_chart):
            charts.append([])
            rows_in_chart = 0
        charts[-1].append(gpu)
        rows_in_chart += rows
    return [_chart(chunk, layouts, nodes, colours, period_from_ns, period_to_ns) for chunk in charts]


def sub_rows(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """Row index per ``[start, end)`` interval so that intervals sharing a row never overlap.

    Greedy interval-graph colouring: intervals taken by start, each on the lowest row free at its
    start. This uses as many rows as the largest number of intervals overlapping at one instant
    (optimal for interval graphs). Returned in the input order.
    """
    ends: list[int] = []  # last end per row
    rows = [0] * len(intervals)
    for i in sorted(range(len(intervals)), key=lambda i: (intervals[i][0], intervals[i][1], i)):
        start, end = intervals[i]
        row = next((r for r, last in enumerate(ends) if last <= start), len(ends))
        if row == len(ends):
            ends.append(end)
        else:
            ends[row] = end
        rows[i] = row
    return rows


def lane_rows(gbars: Sequence[Bar], period_to_ns: int) -> tuple[list[tuple[Bar, int]], list[str]]:
    """(each bar with its row index, row labels) for one GPU lane.

    Row groups: whole-GPU / shared-device allocations first, then one group per MIG device (by
    device UUID); inside a group, concurrent claims are stacked (``sub_rows``). A group taller than
    ``MAX_SUB_ROWS`` draws its extra concurrent claims over its last row (the label says so; the
    sharing table lists every claim).
    """
    groups: dict[tuple[int, str], list[Bar]] = {}
    for b in gbars:
        key = (1, b.device_uuid or b.device_key) if b.is_mig else (0, "whole")
        groups.setdefault(key, []).append(b)
    placed: list[tuple[Bar, int]] = []
    labels: list[str] = []
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda b: (b.from_ns, b.claim_uid, b.device_key))
        rows = sub_rows([(b.from_ns, b.to_ns if b.to_ns is not None else period_to_ns) for b in members])
        height = min(max(rows) + 1, MAX_SUB_ROWS)
        base = len(labels)
        placed.extend((b, base + min(r, height - 1)) for b, r in zip(members, rows))
        name = "whole GPU" if key[0] == 0 else (members[0].mig_profile or "MIG")
        labels.extend([name] * height)
        if max(rows) + 1 > height:
            labels[-1] = f"{name} (+{max(rows) + 1 - height} more concurrent)"
    return placed, labels


# Geometry in SVG user units. The chart is drawn 100 % of the A4 text width (180 mm = 510 pt), so one
# unit is 510 / CHART_WIDTH pt: font sizes of 7.8–8.5 units print at 6.6–7.2 pt.
CHART_WIDTH, LABEL_WIDTH, RIGHT_MARGIN = 600.0, 192.0, 24.0  # the margin holds half of the last tick label
ROW_H, LANE_PAD, LANE_MIN_H = 10.0, 4.0, 24.0
FONT_UUID, FONT_TEXT, FONT_SMALL = 7.8, 8.5, 7.8


def _legible_ticks(t0: int, t1: int, plot_w: float) -> tuple[int, list[tuple[int, str]]]:
    """``axis_ticks`` with as many ticks as fit ``plot_w`` without their clock labels touching."""
    for max_ticks in range(MAX_TICKS, 1, -1):
        step, ticks = axis_ticks(t0, t1, max_ticks)
        widest = max((len(label.rpartition(" ")[2]) for _t, label in ticks), default=0) * 0.62 * FONT_TEXT
        if len(ticks) < 2 or plot_w * step / max(t1 - t0, 1) >= widest + 6:
            return step, ticks
    return step, ticks


def _chart(gpus: list[str], layouts: dict[str, tuple[list[tuple[Bar, int]], list[str]]], nodes: dict[str, str],
           colours: dict[str, str], t0: int, t1: int) -> str:
    label_w, plot_w = LABEL_WIDTH, CHART_WIDTH - LABEL_WIDTH - RIGHT_MARGIN
    span = max(t1 - t0, 1)

    def x(ns: int) -> float:
        return label_w + plot_w * (min(max(ns, t0), t1) - t0) / span

    parts: list[str] = []
    top = 34.0
    y = top
    for gpu in gpus:
        placed, labels = layouts[gpu]
        lane_h = max(ROW_H * len(labels) + LANE_PAD, LANE_MIN_H)
        parts.append(f'<rect x="0" y="{y:.1f}" width="{label_w + plot_w:.1f}" height="{lane_h:.1f}" fill="#f6f6f6" '
                     f'stroke="#bbbbbb" stroke-width="0.5"/>')
        migs = len({b.device_uuid or b.device_key for b, _ in placed if b.is_mig})
        groups = {b.device_uuid or b.device_key if b.is_mig else "" for b, _ in placed}
        stacked = len(labels) - len(groups)
        overflow = [label for label in labels if label.endswith("more concurrent)")]
        # the rows drawn, not the extra ones: "1 stacked row" read wrong beside 2 rows on the page
        note = "".join([f" · MIG ×{migs}" if migs else "",
                        f" · {len(labels)} rows: concurrent claims stacked" if stacked else ""])
        parts.append(f'<text x="3" y="{y + 9:.1f}" font-size="{FONT_UUID}" '
                     f'font-family="DejaVu Sans Mono, monospace">{escape(gpu)}</text>')
        parts.append(f'<text x="3" y="{y + 19:.1f}" font-size="{FONT_SMALL}" fill="#444444">'
                     f'{escape(nodes[gpu])}{escape(note)}</text>')
        for i, label in enumerate(overflow):  # only when a group exceeds MAX_SUB_ROWS (lane ≥ 8 rows high)
            parts.append(f'<text x="3" y="{y + 29 + 10 * i:.1f}" font-size="{FONT_SMALL}" fill="#a00000">'
                         f'{escape(label)} on its last row</text>')
        for row in range(1, len(labels)):  # a thin rule between stacked rows
            ry = y + LANE_PAD / 2 + row * ROW_H
            parts.append(f'<line x1="{label_w:.1f}" y1="{ry:.1f}" x2="{label_w + plot_w:.1f}" y2="{ry:.1f}" '
                         f'stroke="#e0e0e0" stroke-width="0.4"/>')
        for b, row in placed:
            end = b.to_ns if b.to_ns is not None else t1
            bx, bw = x(b.from_ns), max(x(end) - x(b.from_ns), 1.0)
            by = y + LANE_PAD / 2 + row * ROW_H + 1
            style = 'stroke="#222222" stroke-width="0.8" stroke-dasharray="2,1"' if b.is_mig else \
                'stroke="#ffffff" stroke-width="0.4"'
            opacity = "0.35" if b.admin_access else "0.9"
            title = (f"{b.tenant}: {b.namespace}/{b.claim_name} on {b.device_key}"
                     f"{' (' + b.mig_profile + ')' if b.mig_profile else ''} "
                     f"{ns_to_rfc3339(b.from_ns)} – {b.until_text}")
            parts.append(f'<rect x="{bx:.2f}" y="{by:.2f}" width="{bw:.2f}" height="{ROW_H - 2:.1f}" '
                         f'fill="{colours[b.tenant]}" fill-opacity="{opacity}" {style}>'
                         f'<title>{escape(title)}</title></rect>')
            if b.stopped_at_ns is not None and b.stopped_at_ns < t1:  # not observed after: a dotted trail, no bar
                parts.append(f'<line x1="{bx + bw:.2f}" y1="{by + (ROW_H - 2) / 2:.2f}" x2="{x(t1):.2f}" '
                             f'y2="{by + (ROW_H - 2) / 2:.2f}" stroke="#777777" stroke-width="0.8" '
                             f'stroke-dasharray="1,2"><title>{escape(b.until_text)}</title></line>')
        y += lane_h + 2
    step, ticks = _legible_ticks(t0, t1, plot_w)
    axis = [f'<line x1="{label_w}" y1="{top - 6}" x2="{label_w + plot_w}" y2="{top - 6}" stroke="#333333" '
            f'stroke-width="0.6"/>']
    for tick, label in ticks:
        tx = x(tick)
        anchor = "start" if tx - label_w < 12 else "middle"
        axis.append(f'<line x1="{tx:.1f}" y1="{top - 9}" x2="{tx:.1f}" y2="{y:.1f}" stroke="#bbbbbb" '
                    f'stroke-width="0.3"/>')
        day, _, clock = label.rpartition(" ")  # a new UTC day's date goes on a row above the clock time
        if day:
            axis.append(f'<text x="{tx:.1f}" y="8" font-size="{FONT_SMALL}" fill="#444444" '
                        f'text-anchor="{anchor}">{escape(day)}</text>')
        axis.append(f'<text x="{tx:.1f}" y="{top - 12}" font-size="{FONT_TEXT}" text-anchor="{anchor}">'
                    f'{escape(clock)}</text>')
    axis.append(f'<text x="3" y="8" font-size="{FONT_SMALL}" fill="#444444">GPU UUID / node · time UTC,</text>')
    axis.append(f'<text x="3" y="{top - 12}" font-size="{FONT_SMALL}" fill="#444444">grid every '
                f'{escape(step_text(step))}</text>')
    height = y + 4
    if not gpus:
        axis.append(f'<text x="{label_w}" y="{top + 14}" font-size="{FONT_TEXT}">No allocations in the period.</text>')
        height = top + 24
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {CHART_WIDTH:.0f} {height:.0f}" '
            f'width="100%" role="img" aria-label="Allocation timeline per physical GPU" '
            f'font-family="DejaVu Sans, sans-serif">' + "".join(axis + parts) + "</svg>")


def legend(bars: Sequence[Bar]) -> list[tuple[str, str]]:
    """(tenant, colour) pairs for the legend, sorted by tenant."""
    return sorted(tenant_colours(b.tenant for b in bars).items())
