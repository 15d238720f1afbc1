"""``python -m collector.sim``: the fake Kubernetes API server on a fixed port, playing the demo's
bank cluster (``collector.demo_scenario``) in real time, for trying ``draudit run`` locally.

It writes the fraud-scoring service's logs for that timeline (Fluent Bit JSON lines, OTLP/JSON) to
``--logs`` so they can be posted to ``draudit run``'s ``/v1/ingest`` and ``/v1/logs``, then keeps
serving (watches stay open, bookmarks every ``--bookmark-s``) until interrupted. Not for
production: no authentication, plain HTTP on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from collector.demo import steps_for_sim
from collector.demo_scenario import MIN_DURATION_S, build_timeline, generate_logs
from collector.sim.scenario import play
from collector.sim.server import FakeApiServer
from collector.timeutil import NS_PER_S, now_ns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collector.sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=16443, help="port on 127.0.0.1 (default 16443)")
    parser.add_argument("--logs", type=Path, default=Path("sim-logs"), help="directory for the generated logs")
    parser.add_argument("--duration-s", type=float, default=30.0, help="length of the cluster story in seconds")
    parser.add_argument("--delay-s", type=float, default=10.0,
                        help="seconds before the story starts (time to start `draudit run` and let it sync)")
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--bookmark-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.duration_s < MIN_DURATION_S:
        parser.error(f"--duration-s {args.duration_s:g}: the fraud-scoring story needs at least {MIN_DURATION_S:g} s")
    srv = FakeApiServer(bookmark_interval_s=args.bookmark_s)
    try:
        srv.start(args.port)
    except OSError as exc:
        print(f"python -m collector.sim: --port {args.port}: cannot listen ({exc.strerror}); choose another --port",
              file=sys.stderr)
        return 2
    start_ns = now_ns() + int(args.delay_s * NS_PER_S)
    scenario = build_timeline(start_ns, duration_s=args.duration_s)
    logs = generate_logs(scenario, args.logs, n_transactions=args.transactions)
    print(f"fake API server on {srv.url}; the story starts in {args.delay_s:.0f} s and lasts {args.duration_s:.0f} s\n"
          f"logs for it: {logs.fluentbit_path} (POST /v1/ingest), {logs.otlp_path} (POST /v1/logs)", flush=True)
    signal.signal(signal.SIGTERM, _terminate)  # also while waiting for or playing the story
    try:
        time.sleep(max(0.0, (start_ns - now_ns()) / NS_PER_S))
        play(srv, steps_for_sim(scenario.steps), speed=1.0)
        print("story played; serving until interrupted (Ctrl-C)", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


def _terminate(_signum, _frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
