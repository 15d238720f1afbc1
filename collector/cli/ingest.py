"""``draudit ingest PATH... | -``: inference logs from files (plain or gzip) or stdin into the store."""

from __future__ import annotations

import io
import sys

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from
from collector.ingest.parser import FORMATS


def _summary_lines(counts) -> list[str]:
    c = counts.as_dict()
    lines = [f"read {c['read']}  stored {c['stored']} (conflicts {c['conflicts']})  duplicates {c['duplicates']}  "
             f"quarantined {c['quarantined']}  PANs masked {c['pan_masked']}"]
    for reason, n in sorted(counts.reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  quarantined {n:>8}  {reason}")
    if not counts.reconciles:  # a bug, never expected: say it loudly
        lines.append("WARNING: counts do not reconcile (read != stored + duplicates + quarantined)")
    return lines


@click.command("ingest")
@click.argument("paths", nargs=-1, required=True, metavar="PATH... | -")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
              help="Force an envelope (cri, fluentbit, vector, elastic, otlp, ...) or an application "
                   "format (spring_ecs_flat, logstash, gelf, ...) instead of detecting it per line.")
@click.option("--cluster", default=None, help="Cluster name stored with every record (env DRAUDIT_CLUSTER).")
@click.option("--aliases", "aliases_path", default=None, type=click.Path(dir_okay=False),
              help="YAML file: canonical field → list of field names (replaces that field's defaults).")
@click.option("--default-tz", default=None, metavar="ZONE",
              help="IANA zone for timestamps without a zone (env DRAUDIT_INGEST_DEFAULT_TZ); otherwise quarantined.")
@database_option
@output_option
def ingest_cmd(paths: tuple[str, ...], fmt: str, cluster: str | None, aliases_path: str | None,
               default_tz: str | None, database_url: str | None, output: str) -> None:
    """Read inference log lines (Spring ECS/logstash/GELF in CRI, Fluent Bit, Vector, Filebeat or
    OTLP envelopes; plain or .gz; - for stdin), store one record per transaction, quarantine the
    rest with a reason, mask card numbers, and print the counts.

    Exit status: 0 when at least one line was stored or found already stored (or the input had no
    lines); 1 when lines were read but every one was quarantined (the counts are still printed;
    the reasons say what to fix: --format, --aliases, --default-tz); 2 when a .gz input ends
    early or is corrupt (what came before is stored and counted, and the file is named).
    """
    from collector.ingest.aliases import AliasTable
    from collector.ingest.pipeline import IngestRun, open_input, read_error
    from collector.ingest.timestamps import zone

    settings = settings_from(database_url=database_url, cluster=cluster, ingest_default_tz=default_tz)
    if settings.ingest_default_tz:  # a bad zone name is a UserError now, not per line; name where it came from
        zone(settings.ingest_default_tz, "--default-tz" if default_tz is not None else "DRAUDIT_INGEST_DEFAULT_TZ")
    aliases = AliasTable.from_file(aliases_path) if aliases_path else None
    _engine, sessions = open_store(settings)
    run = IngestRun(sessions, settings, forced_format=fmt, aliases=aliases)
    inputs = [open_input(p) for p in paths]
    show_progress = sys.stderr.isatty()
    try:
        if show_progress:
            _ingest_with_progress(run, paths, inputs, fmt, settings.ingest_max_body_bytes)
        else:
            for path, (stream, _pos, _size) in zip(paths, inputs):
                _ingest_one(run, stream, "stdin" if path == "-" else path, fmt, settings.ingest_max_body_bytes)
        counts = run.finish()
        ended_early = [(path, read_error(stream)) for path, (stream, _pos, _size) in zip(paths, inputs)]
    finally:
        for stream, _pos, _size in inputs:
            if stream is not sys.stdin.buffer:
                stream.close()
    if output == "json":
        echo_json(counts.as_dict())
    else:
        for line in _summary_lines(counts):
            click.echo(line)
    for path, error in ended_early:
        if error is not None:
            click.echo(f"draudit: error: {path}: the gzip data ends early or is corrupt ({type(error).__name__}: {error}); "
                       "everything before that point was read and is in the counts above; check that the file was "
                       "copied completely and ingest it again (stored lines are found as duplicates)", err=True)
    if any(error is not None for _path, error in ended_early):
        sys.exit(2)
    if nothing_accepted(counts):
        click.echo(f"draudit: error: none of the {counts.read} lines read could be stored, all were quarantined; "
                   "see the reasons (draudit ingest without --output json lists them) and fix the input or "
                   "use --format, --aliases or --default-tz", err=True)
        sys.exit(1)


def nothing_accepted(counts) -> bool:
    """Lines were read but none was stored or recognised as already stored (exit status 1)."""
    return counts.read > 0 and counts.stored + counts.duplicates == 0


def _ingest_with_progress(run, paths, inputs, fmt: str, max_bytes: int) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        for path, (stream, position, size) in zip(paths, inputs):
            task = progress.add_task(path, total=size)
            _ingest_one(run, stream, "stdin" if path == "-" else path, fmt, max_bytes,
                        on_line=lambda: progress.update(task, completed=position()))
            progress.update(task, completed=size or position())


commands = [ingest_cmd]


def _ingest_one(run, stream, source: str, fmt: str, max_bytes: int, on_line=None) -> None:
    """One input: an OTLP/JSON document as a whole, anything else line by line."""
    from collector.ingest.otlp import records_from_json

    document = _otlp_document(stream, max_bytes) if fmt in ("auto", "otlp") else stream
    if isinstance(document, dict):
        run.add(run.parser.feed_otlp_records(records_from_json(document), source))
    elif document is not None:
        run.ingest_stream(document, source, on_line=on_line)


def _otlp_document(stream, max_bytes: int):
    """An OTLP/JSON ``ExportLogsServiceRequest`` written as one (possibly pretty-printed) document.

    Such a file is what an OpenTelemetry Collector ``file`` exporter or ``curl`` saves: one JSON
    object, not JSON lines. Returns the decoded object when the input is one, else a re-readable
    stream of the bytes already read (or ``None`` when nothing was read), so that line-by-line
    ingestion goes on unchanged.
    """
    from collector.ingest.jsondoc import JsonRejected, decode

    head = stream.read(3)
    if head == b"\xef\xbb\xbf":  # a UTF-8 byte order mark before the document
        head = stream.read(1)
    if head[:1] != b"{":
        return io.BufferedReader(_Prefixed(head, stream), 1 << 20) if head else None
    data = head + stream.read(max_bytes)
    if b"resourceLogs" in data[:4096]:
        try:
            decoded = decode(data.decode("utf-8"))
            if isinstance(decoded.value, dict) and "resourceLogs" in decoded.value and not decoded.conflicts:
                return decoded.value
        except (UnicodeDecodeError, JsonRejected):
            pass
    return io.BufferedReader(_Prefixed(data, stream), 1 << 20)


class _Prefixed(io.RawIOBase):
    """``prefix`` (bytes already read from ``rest``) followed by the rest of the stream, read as
    needed: a large input is never held in memory as a whole."""

    def __init__(self, prefix: bytes, rest) -> None:
        super().__init__()
        self._prefix = memoryview(prefix)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        data = self._rest.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)
