"""``draudit ingest PATH... | -``: inference logs from files (plain or gzip) or stdin into the store."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys

import click

from collector.cli.options import database_option, echo_json, open_store, output_option, settings_from
from collector.errors import UserError
from collector.ingest.parser import FORMATS
from collector.ingest.rotation import continues, in_rotation_order, log_stream
from collector.store.db import shown_url


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
@click.option("--cluster", default=None,
              help="Cluster name stored with every record (env DRAUDIT_CLUSTER): the one the watcher records. Without "
                   "it, a store whose watcher recorded other clusters is refused; a name never watched is stored "
                   "only with --allow-unwatched-cluster.")
@click.option("--allow-unwatched-cluster", is_flag=True,
              help="Store the records under a --cluster the store's watcher has not recorded (yet): they stay "
                   "unknown-cluster until it does, and stay stored (append-only) if the name was a typo.")
@click.option("--aliases", "aliases_path", default=None, type=click.Path(dir_okay=False),
              help="YAML file: canonical field → list of field names (replaces that field's defaults).")
@click.option("--default-tz", default=None, metavar="ZONE",
              help="IANA zone for timestamps without a zone (env DRAUDIT_INGEST_DEFAULT_TZ); otherwise quarantined.")
@database_option
@output_option
def ingest_cmd(paths: tuple[str, ...], fmt: str, cluster: str | None, allow_unwatched_cluster: bool,
               aliases_path: str | None, default_tz: str | None, database_url: str | None, output: str) -> None:
    """Read inference log lines (Spring ECS/logstash/GELF in CRI, Fluent Bit, Vector, Filebeat or
    OTLP envelopes; plain or .gz; - for stdin), store each line that carries a transaction id once
    (a transaction scored again differently is flagged as a conflict), quarantine the rest with a
    reason, mask card numbers, and print the counts.

    Exit status: 0 when at least one line was stored or found already stored (or the input had no
    lines); 1 when lines were read but every one was quarantined (the counts are still printed;
    the reasons say what to fix: --format, --aliases, --default-tz); 2 when a .gz input ends
    early or is corrupt (what came before is stored and counted, and the file is named).
    """
    from collector.ingest.aliases import AliasTable
    from collector.ingest import parse_pool
    from collector.ingest.pipeline import IngestRun, open_input, read_error
    from collector.ingest.timestamps import zone

    settings = settings_from(database_url=database_url, cluster=cluster, ingest_default_tz=default_tz)
    if settings.ingest_default_tz:  # a bad zone name is a UserError now, not per line; name where it came from
        zone(settings.ingest_default_tz, "--default-tz" if default_tz is not None else "DRAUDIT_INGEST_DEFAULT_TZ")
    aliases = AliasTable.from_file(aliases_path) if aliases_path else None
    _engine, sessions = open_store(settings)
    if not allow_unwatched_cluster:
        _refuse_unwatched_cluster(sessions, settings.cluster,
                                  implicit=cluster is None and "DRAUDIT_CLUSTER" not in os.environ)
    run = IngestRun(sessions, settings, forced_format=fmt, aliases=aliases)
    reals = {p: _real(p) for p in paths}  # resolved once: grouping, order, streams, continuation
    paths = _read_once(paths, reals)
    # a container log's rotated files and its live log, oldest first (a shell glob gives newest first)
    paths = tuple(paths[i] for i in in_rotation_order([reals[p] for p in paths]))
    run.parser.streams.update({_source(p): log_stream(_kubelet_file(p) or reals[p]) for p in paths})
    inputs = [open_input(p) for p in paths]
    show_progress = sys.stderr.isatty()
    try:
        for path, (stream, _pos, _size) in zip(paths, inputs):  # before anything is read: all or nothing
            _refuse_protobuf(stream, "stdin" if path == "-" else path)
        if show_progress:
            _ingest_with_progress(run, paths, reals, inputs, fmt, settings.ingest_max_body_bytes)
        else:
            for i, (path, (stream, _pos, _size)) in enumerate(zip(paths, inputs)):
                with _read_errors_named(run, path):
                    _ingest_one(run, stream, _source(path), fmt, settings.ingest_max_body_bytes)
                _end_source(run, paths, reals, i)
        counts = run.finish()
        ended_early = [(path, read_error(stream)) for path, (stream, _pos, _size) in zip(paths, inputs)]
    except parse_pool.WorkerEnded as exc:
        run.close()
        raise UserError(f"{exc}: killed, most likely by the out-of-memory killer; what was committed before "
                        "stays stored — run the same command again (stored lines are found as duplicates), with "
                        "more memory or smaller inputs") from None
    finally:
        for stream, _pos, _size in inputs:
            if stream is not sys.stdin.buffer:
                stream.close()
    if output == "json":
        echo_json(counts.as_dict())
    else:
        for line in _summary_lines(counts):
            click.echo(line)
        click.echo(f"  run {run.run_id}")
        if counts.quarantined:
            # each input that had lines refused (the first input may have none): a command the user can paste
            store = f" --database-url {shlex.quote(shown_url(database_url))}" if database_url else ""
            for source in list(run.quarantined_sources)[:_HINTS] or [_source(paths[0])]:
                click.echo(f"  the quarantined lines: draudit quarantine --source {shlex.quote(source)}{store}")
            if len(run.quarantined_sources) > _HINTS:
                click.echo(f"  (and {len(run.quarantined_sources) - _HINTS} more input(s) with quarantined lines)")
    late = run.parser.builder.logged_after_written
    if late:
        click.echo(f"draudit: warning: {late} record(s) have an event time more than a second later than the "
                   "container runtime wrote their line, which cannot be: the application writes its times in another "
                   "zone than it states (a local time with a Z) or they are misread (log-formats §5.4); they are "
                   "attributed at the times as logged — each record's draudit.warnings says by how much; fix the "
                   "application's zone (or --default-tz for zone-less times) and ingest again", err=True)
    unwatched = _unwatched_cluster(sessions, settings.cluster) if counts.stored else None
    if unwatched:
        click.echo(f"draudit: warning: cluster {settings.cluster!r} has no watch history in this store (watched: "
                   f"{', '.join(unwatched)}): its records cannot be attributed (unknown-cluster); ingest the same "
                   "files again with --cluster NAME (or DRAUDIT_CLUSTER) — those copies are stored beside these, "
                   "no conflict; these stay (the store is append-only) as unknown-cluster: render packs with "
                   "--cluster NAME to leave them out", err=True)
    for path, error in ended_early:
        if error is not None:
            click.echo(f"draudit: error: {path}: the gzip data ends early or is corrupt ({type(error).__name__}: {error}); "
                       "everything before that point was read and is in the counts above; check that the file was "
                       "copied completely and ingest it again (stored lines are found as duplicates)", err=True)
    if any(error is not None for _path, error in ended_early):
        sys.exit(2)
    if nothing_accepted(counts):
        click.echo(f"draudit: error: none of the {counts.read} lines read could be stored, all were quarantined; "
                   "see the reasons and the lines themselves (draudit quarantine --source …) and fix the input "
                   "or use --format, --aliases or --default-tz", err=True)
        sys.exit(1)


def _refuse_unwatched_cluster(sessions, cluster: str, *, implicit: bool) -> None:
    """Refuse to stamp a cluster name the store's watcher never recorded, when it recorded others, on
    records before anything is stored: they could not be attributed (``unknown-cluster``) and, the
    store being append-only, would stay — the default name, which nobody chose (``implicit``), or a
    typo (``bank-eu-inference-l``). A cluster the watcher will record later is stored with
    ``--allow-unwatched-cluster`` (and warned about after the run).

    Raises:
        UserError: (exit 2) naming the watched clusters, the closest one, and the flags to give.
    """
    watched = _unwatched_cluster(sessions, cluster)
    if not watched:
        return
    names = ", ".join(repr(w) for w in watched)
    if implicit:
        raise UserError(f"no --cluster given: this store's watcher recorded {names}, not {cluster!r} (the default); "
                        "records stored under it could never be attributed and would stay (the store is append-only) "
                        "— give --cluster NAME (or DRAUDIT_CLUSTER) naming the cluster the logs come from, or "
                        f"--cluster {cluster} --allow-unwatched-cluster to store them under the default anyway")
    import difflib

    # a case variant first (Kubernetes names are lowercase; a shipper's label may not be), then a typo
    close = ([w for w in watched if w.casefold() == cluster.casefold()]
             or difflib.get_close_matches(cluster.casefold(), watched, n=1, cutoff=0.8))
    raise UserError(f"--cluster {cluster!r}: this store's watcher recorded {names}, not it"
                    + (f" (did you mean {close[0]!r}?)" if close else "")
                    + "; records stored under it could not be attributed until the watcher records it, and would stay "
                    "(the store is append-only) — check the name, or give --allow-unwatched-cluster for a cluster the "
                    "watcher will record later")


def _unwatched_cluster(sessions, cluster: str) -> list[str] | None:
    """The clusters the store's watcher recorded, when ``cluster`` (the one this run stamped on its
    records) is not among them; None when it is, or when the store has no watch history at all (an
    ingest-only store: attribution names no cluster then)."""
    from collector.lineage import known_clusters

    with sessions() as session:
        watched = known_clusters(session)
    return watched if watched and cluster not in watched else None


@contextlib.contextmanager
def _read_errors_named(run, path: str):
    """Turn a failed read of ``path`` (an I/O error of a failing disk, a stale NFS handle) into a
    ``UserError`` that names it; what earlier batches committed stays stored."""
    try:
        yield
    except OSError as exc:
        run.close()
        raise UserError(f"{'stdin' if path == '-' else path}: reading it failed ({exc.strerror or exc}) after "
                        f"{run.counts.read} lines of this run; the lines committed before stay stored — fix the "
                        "input and run the same command again (stored lines are found as duplicates)") from None


def nothing_accepted(counts) -> bool:
    """Lines were read but none was stored or recognised as already stored (exit status 1)."""
    return counts.read > 0 and counts.stored + counts.duplicates == 0


def _ingest_with_progress(run, paths, reals, inputs, fmt: str, max_bytes: int) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        for i, (path, (stream, position, size)) in enumerate(zip(paths, inputs)):
            task = progress.add_task(path, total=size)
            with _read_errors_named(run, path):
                _ingest_one(run, stream, _source(path), fmt, max_bytes,
                            on_line=lambda: progress.update(task, completed=position()))
            _end_source(run, paths, reals, i)
            progress.update(task, completed=size or position())


def _end_source(run, paths, reals: dict[str, str], i: int) -> None:
    """``paths[i]`` was read: its open partial lines end here unless the next input is the next
    file of its log stream (kubelet rotation, ``rotation.continues``; ``reals``: ``_real`` of each path)."""
    following = reals[paths[i + 1]] if i + 1 < len(paths) else None
    run.end_source(_source(paths[i]), continued=continues(reals[paths[i]], following))


commands = [ingest_cmd]


def _refuse_protobuf(stream, source: str) -> None:
    """Raise ``UserError`` naming ``source`` when the input is an OTLP protobuf file.

    Read as lines, a protobuf message becomes junk quarantine rows (and a PAN in it touches tag
    and length bytes that read as digits); OTLP protobuf is read over HTTP, where a request is
    decoded as a whole.
    """
    from collector.ingest.otlp import PROTOBUF_PEEK_BYTES, looks_like_otlp_protobuf

    if looks_like_otlp_protobuf(stream.peek(PROTOBUF_PEEK_BYTES)[:PROTOBUF_PEEK_BYTES]):
        raise UserError(f"{source}: this is binary OTLP protobuf (an ExportLogsServiceRequest), not a log file; "
                        "send it to the OTLP/HTTP endpoint instead (draudit run serves POST /v1/logs, "
                        "Content-Type: application/x-protobuf), or export OTLP/JSON to a file and ingest that")


def _real(path: str) -> str:
    """``path`` resolved through symlinks (``stdin`` for ``-``), named as ``_source`` names: what
    tells which files are one log stream (a ``/var/log/containers`` link to a pod's live log)."""
    return _source(path if path == "-" else os.path.realpath(path))


_MAX_LINKS = 40  # as the kernel's limit on symlinks followed in one lookup


def _kubelet_file(path: str) -> str | None:
    """The kubelet's ``/var/log/pods/…`` name of ``path`` when ``path`` is a symlink chain through
    one (``/var/log/containers/X.log`` → ``/var/log/pods/<ns>_<pod>_<uid>/<c>/0.log``, which with
    the docker engine links on to ``/var/lib/docker/containers/<id>/<id>-json.log``): that name
    carries the pod uid, the final file's does not. None otherwise."""
    if path == "-":
        return None
    current = path
    for _ in range(_MAX_LINKS):
        if not os.path.islink(current):
            return None
        try:
            current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
        except OSError:
            return None
        if "/var/log/pods/" in current:
            return current
    return None


def _read_once(paths: tuple[str, ...], reals: dict[str, str]) -> tuple[str, ...]:
    """``paths`` without a file given again (overlapping globs, a link to a file also given; ``reals``:
    ``_real`` of each): each is read once, with a warning — read twice, its records were duplicates
    and a CRI line it leaves open was quarantined as never completed while its second reading
    completed it."""
    seen: dict[str, str] = {}
    kept = []
    for path in paths:
        real = reals[path]
        if path != "-" and real in seen:
            click.echo(f"draudit: warning: {path} is the file {seen[real]} given again: read once", err=True)
            continue
        seen.setdefault(real, path)
        kept.append(path)
    return tuple(kept)


def _source(path: str) -> str:
    """The source recorded for ``path``: ``stdin``, or the absolute path, so that the quarantine
    position (source, line) and the pod identity read from ``/var/log/pods/<ns>_<pod>_<uid>/…``
    do not depend on the directory the command ran in. A file name that is not UTF-8 (Python
    holds its bytes as lone surrogates, which no database text column takes) is recorded with
    those bytes written ``\\xNN``."""
    if path == "-":
        return "stdin"
    return os.fsencode(os.path.abspath(path)).decode("utf-8", "backslashreplace")


def _ingest_one(run, stream, source: str, fmt: str, max_bytes: int, on_line=None) -> None:
    """One input: a JSON array element by element, an OTLP/JSON document as a whole, anything
    else line by line."""
    stream, array = _starts_json_array(_filled(stream), max_bytes)
    if array:
        _ingest_array(run, stream, source, max_bytes, on_line)
        return
    document = _otlp_document(stream, max_bytes) if fmt in ("auto", "otlp") else stream
    if isinstance(document, dict):
        run.add(run.parser.feed_otlp_document(document, source))
    elif document is not None:
        _ingest_text(run, document, source, max_bytes, on_line)


def _ingest_text(run, stream, source: str, max_bytes: int, on_line=None, first_line: int = 1) -> None:
    """The lines of ``stream``, numbered from ``first_line``; read as pretty-printed JSON objects
    and lines (``jsonarray.feed_pretty``) when a line of its first ``_ARRAY_PEEK`` bytes is a lone
    ``{`` (``jq .`` output: read line by line, every line of an object was a junk quarantine row)
    and the input is at most ``max_bytes`` (the body limit): an object is then one unit
    positioned ``object <i>``."""
    from collector.ingest.jsonarray import feed_pretty, starts_pretty_object

    stream = _filled(stream)  # a re-readable stream's peek may give only its first piece
    if starts_pretty_object(stream.peek(_ARRAY_PEEK)[:_ARRAY_PEEK].removeprefix(b"\xef\xbb\xbf")):
        data = stream.read(max_bytes + 1)
        if len(data) <= max_bytes:
            feed_pretty(run, data.removeprefix(b"\xef\xbb\xbf"), source, first_line)
            return
        stream = io.BufferedReader(_Prefixed(data, stream), 1 << 20)
    run.ingest_stream(stream, source, on_line=on_line, first_line=first_line)


_ARRAY_PEEK = 4096
_HINTS = 5  # inputs named in the quarantine hint after a run
_NEXT_LINE_PEEK = 256  # of the line after a long first line: enough to see whether it starts an array


def _filled(stream):
    """``stream`` with its first ``_ARRAY_PEEK`` bytes (or all, when shorter) visible to ``peek``:
    a pipe's ``peek`` gives what the writer has written so far (``[`` and a newline), too little
    to tell an array from a text line; then the head is read (waiting for it) and put back."""
    if len(stream.peek(_ARRAY_PEEK)) >= _ARRAY_PEEK:
        return stream
    head = stream.read(_ARRAY_PEEK)
    return io.BufferedReader(_Prefixed(head, stream), 1 << 20)


_WHITESPACE = b" \t\r\n"


def _starts_json_array(stream, max_bytes: int):
    """``(stream, True)`` when the input (after a UTF-8 byte order mark) starts like a JSON array
    of records — ``[`` and then, after whitespace, ``{`` or the closing ``]``, as Fluent Bit's
    ``format json`` or Vector's ``codec: json`` write one, often pretty-printed over many lines —
    to be read as a stream of elements; ``(stream, False)``: read it line by line. ``stream``
    comes back re-readable from its start (it may have been read ahead).

    A text line that starts with a bracket (a JVM warning ``[0.011s][warning]…``, Logback's
    ``[main] INFO …``) is no array. Nor are arrays one per line (``jsonarray.arrays_one_per_line``:
    the first line ends its array, or the next starts another): saved batches are read line by line, each array line's elements units
    (``<line> element <i>``, a line held to the body limit ``max_bytes``, its records to the line
    limit), so a broken line costs only itself; streamed as arrays, it took the lines after it
    into its unterminated tail. A first line longer than ``_ARRAY_PEEK`` is read (up to
    ``max_bytes``) to find where it ends."""
    from collector.ingest.jsonarray import arrays_one_per_line, starts_record_array

    head = stream.peek(_ARRAY_PEEK)[:_ARRAY_PEEK].removeprefix(b"\xef\xbb\xbf").lstrip(_WHITESPACE)
    if not starts_record_array(head):
        return stream, False
    newline = head.find(b"\n")
    first, following = (head[:newline + 1], head[newline + 1:]) if newline >= 0 else (b"", b"")
    if newline < 0 and len(stream.peek(_ARRAY_PEEK)) >= _ARRAY_PEEK:  # the first line goes on past the peek
        first = stream.readline(max_bytes + 1)
        following = stream.peek(_NEXT_LINE_PEEK)[:_NEXT_LINE_PEEK] if first.endswith(b"\n") else b""
        stream = _filled(io.BufferedReader(_Prefixed(first, stream), 1 << 20))
    return stream, not arrays_one_per_line(first, following)


def _ingest_array(run, stream, source: str, max_bytes: int, on_line=None) -> None:
    """Every element of the JSON array in ``stream``, read piece by piece (``jsonarray``): positions
    ``element <i>``, ``read`` counts elements. An element is held to the line limit, or to the body
    limit ``max_bytes`` when it is an OTLP/JSON export request (``LineParser.feed_bytes``).

    What follows the array is read too, nothing dropped: further arrays (one per line, as saved
    HTTP batches are; their elements numbered on), and any other text line by line, each line
    positioned by its number in the input."""
    from collector.ingest.jsonarray import CHUNK_BYTES, JsonArrayElements, feed_elements, starts_record_array

    limit = max(run.parser.max_line_bytes, max_bytes)
    counted = _CountingReader(stream)
    reader = counted
    last = 0
    while True:
        elements = JsonArrayElements(reader, limit, keep_after=True)
        last = feed_elements(run, elements, source, on_element=on_line, first=last + 1)
        if elements.after is None:  # the input ended inside the array (its tail quarantined)
            return
        after = elements.after.lstrip(_WHITESPACE)
        while len(after) < _ARRAY_PEEK:  # enough to tell what comes next
            more = counted.read(CHUNK_BYTES)
            if not more:
                break
            after = (after + more).lstrip(_WHITESPACE)
        if not after:
            return
        if starts_record_array(after):
            reader = _Prefixed(after, counted)
            continue
        # Lines before ``after``: every newline read, less those still ahead in ``after``.
        first_line = counted.newlines - after.count(b"\n") + 1
        _ingest_text(run, io.BufferedReader(_Prefixed(after, counted), 1 << 20), source, max_bytes, on_line, first_line)
        return


class _CountingReader:
    """``read`` of ``stream`` that counts the newline bytes read (the line number where a JSON array ends)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.newlines = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.newlines += data.count(b"\n")
        return data


def _otlp_document(stream, max_bytes: int):
    """An OTLP/JSON ``ExportLogsServiceRequest`` written as one (possibly pretty-printed) document.

    Such a file is what an OpenTelemetry Collector ``file`` exporter or ``curl`` saves: one JSON
    object, not JSON lines. Returns the decoded object when the input is one, else a re-readable
    stream of the bytes already read (or ``None`` when nothing was read), so that line-by-line
    ingestion goes on unchanged.
    """
    from collector.ingest.jsondoc import DEFAULT_MAX_DEPTH, JsonRejected, decode
    from collector.ingest.otlp import json_depth_limit

    head = stream.read(3)
    if head == b"\xef\xbb\xbf":  # a UTF-8 byte order mark before the document
        head = stream.read(1)
    if head[:1] != b"{":
        return io.BufferedReader(_Prefixed(head, stream), 1 << 20) if head else None
    data = head + stream.read(max_bytes)
    if b"resourceLogs" in data[:4096]:
        try:
            decoded = decode(data.decode("utf-8"), max_depth=json_depth_limit(DEFAULT_MAX_DEPTH))
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
