"""Fake Kubernetes API server and scenario driver for tests and demos.

``FakeApiServer`` speaks the real list/watch protocol over HTTP/1.1 on loopback (see
``/work/shared/reference/watch-semantics.md`` §14 for the checklist it follows), so the official
``kubernetes`` client and the collector's reflector run against it unchanged. ``Fault`` injects
the failures real clusters produce. ``collector.sim.scenario`` plays timelines of writes and
faults; ``collector.sim.dra_objects`` builds realistic DRA objects.
"""

from collector.sim.faults import Fault
from collector.sim.server import FakeApiServer, RequestRecord

__all__ = ["FakeApiServer", "Fault", "RequestRecord"]
