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
        UserError: no usable configuration, naming what was tried and the flag that fixes it.
    """
    if host:
        cfg = kubernetes.client.Configuration()
        cfg.host = host.rstrip("/")
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
