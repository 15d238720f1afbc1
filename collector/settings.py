"""The one settings object: environment variables (``DRAUDIT_*``) overridden by CLI flags.

Every value is validated when the object is built; a bad value raises ``UserError`` naming the
variable and the accepted form. Durations carry their unit in the name (``*_s``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from collector.errors import UserError

DEFAULT_DATABASE_URL = "sqlite:///./draudit.db"
# Upper bound of DRAUDIT_CLOCK_SKEW_S: collector.lineage.MAX_CLOCK_SKEW_S (same rule as
# `draudit attribute --clock-skew-s`; not imported: every command start stays light).
MAX_CLOCK_SKEW_S = 86_400.0
# Bounds of DRAUDIT_LEASE_DURATION_S under leader election: the elector renews every 2/15 of it
# and fences itself 1 s before it ends, and the Lease holds it as whole seconds.
MIN_LEASE_DURATION_S = 2.0
MAX_LEASE_DURATION_S = 86_400.0
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# The shipped Rego bundle. It lives in ``policies/`` at the repository root (the product's layout);
# ``collector/policy/default_bundle`` is a symbolic link to it, so the wheel carries its files as
# package data of ``collector.policy.default_bundle`` (setuptools follows the link) and an installed
# draudit finds them next to its code. In the source tree this resolves to ``policies/`` itself.
DEFAULT_POLICY_BUNDLE = (Path(__file__).resolve().parent / "policy" / "default_bundle").resolve()

# Environment variable → Settings field. The compose file and the deploy manifests may only use
# names listed here (a test checks that).
ENV_VARS: dict[str, str] = {
    "DRAUDIT_DATABASE_URL": "database_url",
    "DRAUDIT_CLUSTER": "cluster",
    "DRAUDIT_KUBECONFIG": "kubeconfig",
    "DRAUDIT_KUBE_CONTEXT": "kube_context",
    "DRAUDIT_OPA_URL": "opa_url",
    "DRAUDIT_OPA_TIMEOUT_S": "opa_timeout_s",
    "DRAUDIT_POLICY_BUNDLE": "policy_bundle",
    "DRAUDIT_HTTP_HOST": "http_host",
    "DRAUDIT_HTTP_PORT": "http_port",
    "DRAUDIT_INGEST_TOKEN": "ingest_token",
    "DRAUDIT_INGEST_TOKEN_FILE": "ingest_token_file",
    "DRAUDIT_INGEST_MAX_BODY_BYTES": "ingest_max_body_bytes",
    "DRAUDIT_INGEST_MAX_LINE_BYTES": "ingest_max_line_bytes",
    "DRAUDIT_INGEST_DEFAULT_TZ": "ingest_default_tz",
    "DRAUDIT_PAN_TOKEN_KEY": "pan_token_key",
    "DRAUDIT_PAN_TOKEN_KEY_FILE": "pan_token_key_file",
    "DRAUDIT_CLOCK_SKEW_S": "clock_skew_s",
    "DRAUDIT_SIGN_KEY": "sign_key",
    "DRAUDIT_PACK_DIR": "pack_dir",
    "DRAUDIT_LEADER_ELECT": "leader_elect",
    "DRAUDIT_LEASE_NAMESPACE": "lease_namespace",
    "DRAUDIT_LEASE_NAME": "lease_name",
    "DRAUDIT_LEASE_DURATION_S": "lease_duration_s",
    "DRAUDIT_IDENTITY": "identity",
    "DRAUDIT_WATCH_READ_TIMEOUT_S": "watch_read_timeout_s",
    "DRAUDIT_WATCH_TIMEOUT_S": "watch_timeout_s",
    "DRAUDIT_BACKOFF_INITIAL_S": "backoff_initial_s",
    "DRAUDIT_BACKOFF_MAX_S": "backoff_max_s",
    "DRAUDIT_LIST_PAGE_SIZE": "list_page_size",
    "DRAUDIT_LOG_LEVEL": "log_level",
}


@dataclass(frozen=True)
class Settings:
    """Validated configuration for every draudit command.

    Attributes (units in the names): see ``ENV_VARS`` for the environment variable of each.
    """

    database_url: str = DEFAULT_DATABASE_URL
    cluster: str = "default"
    kubeconfig: str | None = None
    kube_context: str | None = None
    opa_url: str | None = None
    opa_timeout_s: float = 10.0
    policy_bundle: Path = DEFAULT_POLICY_BUNDLE
    http_host: str = "0.0.0.0"
    http_port: int = 8080
    ingest_token: str | None = None
    ingest_token_file: str | None = None
    ingest_max_body_bytes: int = 16 * 1024 * 1024
    ingest_max_line_bytes: int = 64 * 1024
    ingest_default_tz: str | None = None
    pan_token_key: str | None = None
    pan_token_key_file: str | None = None
    clock_skew_s: float = 2.0
    sign_key: str | None = None
    pack_dir: Path = Path("./packs")
    leader_elect: bool = False
    lease_namespace: str = "draudit"
    lease_name: str = "draudit-collector"
    lease_duration_s: float = 15.0
    identity: str = field(default_factory=lambda: os.environ.get("HOSTNAME") or os.uname().nodename)
    watch_read_timeout_s: float = 75.0
    watch_timeout_s: int = 300
    backoff_initial_s: float = 0.8
    backoff_max_s: float = 30.0
    list_page_size: int = 500
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        _check(self.database_url.strip() != "", "DRAUDIT_DATABASE_URL", "must not be empty")
        _check(self.cluster.strip() != "", "DRAUDIT_CLUSTER", "must not be empty")
        _check(not _holds_pan(self.cluster), "DRAUDIT_CLUSTER",
               "must not hold a card number (PAN): the cluster name is stored in every row, unmasked")
        _check(0 < self.http_port < 65536, "DRAUDIT_HTTP_PORT", "must be a TCP port 1..65535")
        # The clock-skew tolerance as `draudit attribute` checks it; inf was accepted here and then
        # failed every attribution run of `draudit run`.
        _check(math.isfinite(self.clock_skew_s) and 0 <= self.clock_skew_s <= MAX_CLOCK_SKEW_S,
               f"DRAUDIT_CLOCK_SKEW_S={self.clock_skew_s:g}",
               f"must be a non-negative number of seconds, at most {MAX_CLOCK_SKEW_S:.0f}")
        for name in ("opa_timeout_s", "lease_duration_s", "watch_read_timeout_s", "backoff_initial_s", "backoff_max_s"):
            # inf/nan failed later, in a job or a thread (int(inf) is an OverflowError)
            _check(math.isfinite(getattr(self, name)) and getattr(self, name) >= 0, _env_of(name),
                   "must be a finite, non-negative number of seconds")
        if self.leader_elect:  # LeaseElector's ValueError, after the HTTP server had started
            _check(MIN_LEASE_DURATION_S <= self.lease_duration_s <= MAX_LEASE_DURATION_S,
                   f"DRAUDIT_LEASE_DURATION_S={self.lease_duration_s:g}",
                   f"must be {MIN_LEASE_DURATION_S:.0f} to {MAX_LEASE_DURATION_S:.0f} seconds with leader election "
                   "(DRAUDIT_LEADER_ELECT, --leader-elect)")
        if self.opa_url is not None:  # its form only: OPA may start after the collector
            _check(_is_opa_url(self.opa_url), f"DRAUDIT_OPA_URL={self.opa_url!r}",
                   "must look like http://opa.example:8181 (scheme http or https, host, port; no path)")
        for name in ("ingest_max_body_bytes", "ingest_max_line_bytes", "list_page_size", "watch_timeout_s"):
            _check(getattr(self, name) > 0, _env_of(name), "must be a positive integer")
        _check(self.log_level.upper() in {"DEBUG", "INFO", "WARNING", "ERROR"}, "DRAUDIT_LOG_LEVEL",
               "must be one of DEBUG, INFO, WARNING, ERROR")

    def with_overrides(self, **overrides: Any) -> "Settings":
        """Return a copy with the non-``None`` overrides applied (CLI flags win over env)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **clean) if clean else self

    def resolved_pan_token_key(self) -> bytes | None:
        """The key of masked transaction ids' tokens (``collector.ingest.pan.mask_identifier``):
        ``pan_token_key`` (it wins when both are set) or the content of ``pan_token_key_file``, as
        UTF-8 bytes; None when neither is set.

        Raises:
            UserError: the key file cannot be read, or is empty.
        """
        if self.pan_token_key:
            return self.pan_token_key.encode("utf-8")
        if self.pan_token_key_file:
            try:
                key = Path(self.pan_token_key_file).read_text().strip().encode("utf-8")
            except OSError as exc:
                raise UserError(f"DRAUDIT_PAN_TOKEN_KEY_FILE={self.pan_token_key_file}: cannot read it "
                                f"({exc.strerror})") from exc
            if not key:  # a Secret mounted empty must not silently mean "no key"
                raise UserError(f"DRAUDIT_PAN_TOKEN_KEY_FILE={self.pan_token_key_file}: the file is empty; put the "
                                "key in it, or unset the variable to run without tokens")
            return key
        return None

    def resolved_ingest_token(self) -> str | None:
        """The bearer token for HTTP ingestion: ``ingest_token`` or the content of ``ingest_token_file``.

        Raises:
            UserError: the token file cannot be read, or is empty.
        """
        if self.ingest_token:
            return self.ingest_token
        if self.ingest_token_file:
            try:
                token = Path(self.ingest_token_file).read_text().strip()
            except OSError as exc:
                raise UserError(f"DRAUDIT_INGEST_TOKEN_FILE={self.ingest_token_file}: cannot read it ({exc.strerror})") from exc
            if not token:  # a Secret mounted empty must not silently mean "ingestion closed"
                raise UserError(f"DRAUDIT_INGEST_TOKEN_FILE={self.ingest_token_file}: the file is empty; put the "
                                "token in it, or unset the variable to run with ingestion closed")
            return token
        return None


def _env_of(field_name: str) -> str:
    return next((k for k, v in ENV_VARS.items() if v == field_name), field_name)


def _holds_pan(text: str) -> bool:
    """True when ``text`` holds a card number (``pan.mask_text`` would mask it); the masker is
    imported only for a text with 13 digits or more (every other command start stays light)."""
    if sum(ch.isdigit() for ch in text) < 13:
        return False
    from collector.ingest.pan import mask_text

    return mask_text(text)[1] > 0


def _is_opa_url(url: str) -> bool:
    """``url`` has the form ``OpaServerEngine`` accepts: http(s), a host, a valid port, no path
    (reachability is not checked: OPA may start after the collector)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number 0..65535
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/") \
        and not parts.query and not parts.fragment


def _check(ok: bool, name: str, what: str) -> None:
    if not ok:
        raise UserError(f"{name} {what}")


def _coerce(field_name: str, raw: str, annotation: str) -> Any:
    env = _env_of(field_name)
    text = raw.strip()
    try:
        if annotation in ("int",):
            return int(text)
        if annotation in ("float",):
            return float(text)
        if annotation in ("bool",):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if annotation in ("Path",):
            return Path(text)
    except ValueError:
        raise UserError(f"{env}={raw!r} is not a valid {annotation}") from None
    return text or None if annotation.endswith("None") else text


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build ``Settings`` from ``environ`` (default ``os.environ``) and CLI ``overrides``.

    Raises:
        UserError: a variable has a value of the wrong type or out of range.
    """
    env = os.environ if environ is None else environ
    types = {f.name: str(f.type) for f in fields(Settings)}
    values: dict[str, Any] = {}
    for var, name in ENV_VARS.items():
        if var in env:
            values[name] = _coerce(name, env[var], types[name])
    if "kubeconfig" not in values and env.get("KUBECONFIG"):
        values["kubeconfig"] = env["KUBECONFIG"]
    settings = Settings(**values)
    return settings.with_overrides(**overrides)
