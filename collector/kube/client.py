"""Kubernetes client configuration: in-cluster service account, a kubeconfig, or an explicit host.

The official ``kubernetes`` client is used for transport (auth, TLS, proxies, retries on 429);
responses are read raw so that no field the client's models do not know is ever dropped.
"""

from __future__ import annotations

import os

import kubernetes
import yaml
from kubernetes.config.config_exception import ConfigException

from collector.errors import UserError


def make_api_client(*, kubeconfig: str | None = None, context: str | None = None, host: str | None = None) -> kubernetes.client.ApiClient:
    """Build an ``ApiClient``.

    Order: an explicit ``host`` (tests, the demo's fake API server; no auth), else ``kubeconfig``
    (+ ``context``), else the in-cluster service account when ``KUBERNETES_SERVICE_HOST`` is set,
    else ``~/.kube/config``.

    Raises:
        UserError: no usable configuration, naming what was tried and the flag that fixes it; a
            ``host`` that is not an http(s) URL with a host (``--server``).
    """
    if host:
        cfg = kubernetes.client.Configuration()
        cfg.host = check_server_url(host).rstrip("/")
        return kubernetes.client.ApiClient(cfg)
    try:
        if kubeconfig:
            return kubernetes.config.new_client_from_config(config_file=kubeconfig, context=context)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = kubernetes.client.Configuration()
            kubernetes.config.load_incluster_config(client_configuration=cfg)
            return kubernetes.client.ApiClient(cfg)
        return kubernetes.config.new_client_from_config(context=context)
    except (ConfigException, FileNotFoundError, OSError, yaml.YAMLError, TypeError, ValueError, AttributeError) as exc:
        # yaml errors carry the line and column; a file that parses but is not a kubeconfig
        # (a list, a string) fails inside the loader with a type/attribute error.
        where = kubeconfig or "~/.kube/config (no in-cluster service account either)"
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"cannot configure the Kubernetes client from {where}: {detail}; pass --kubeconfig FILE [--context NAME]") from None


def check_server_url(url: str) -> str:
    """``url`` (``--server``) if it is an ``http://`` or ``https://`` URL with a host and a valid
    port; ``localhost:16443`` (no scheme) was taken as scheme ``localhost`` and retried forever
    ("No host specified").

    Raises:
        UserError: naming ``--server`` and the expected form.
    """
    from urllib.parse import urlsplit

    text = url.strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number 0..65535
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and not parts.fragment
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"--server {url!r} is not a URL of the form https://host:port (scheme, host, port; "
                        "http://127.0.0.1:16443 for the local simulator, python -m collector.sim)")
    return text
