"""Which API version serves each watched kind, and how to reach it.

``resource.k8s.io`` is discovered (``GET /apis/resource.k8s.io``): v1 is preferred, then v1beta2,
then v1beta1 (dra-api.md §1.4: pick the best served version yourself, do not rely on
``preferredVersion``). One watch per kind: an object has the same uid and resourceVersion in every
served version, so watching two versions would only duplicate events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import kubernetes

from collector.errors import UserError

RESOURCE_GROUP = "resource.k8s.io"
PREFERRED_RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")


@dataclass(frozen=True)
class KindSpec:
    """A watched kind: its group/version, plural, list kind and scope.

    ``collection_path`` is the all-namespaces LIST/WATCH path.
    """

    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def collection_path(self) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{prefix}/{self.plural}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


class DiscoveryUnavailable(UserError):
    """Discovery could not get an answer (transport error, HTTP 401/403/429/5xx): worth retrying."""


def discover_resource_version(api_client: kubernetes.client.ApiClient) -> str:
    """The best served version of ``resource.k8s.io`` (v1 > v1beta2 > v1beta1).

    Raises:
        DiscoveryUnavailable: no answer yet — the API server is unreachable, overloaded or
            restarting, or our credentials are not (yet) accepted; the caller retries.
        UserError: the server answered that the group is not served, or only in versions we do
            not read (DRA disabled or older than 1.32), naming the versions it offers.
    """
    host = api_client.configuration.host
    headers = {"Accept": "application/json"}
    try:
        api_client.update_params_for_auth(headers, [], ["BearerToken"], f"/apis/{RESOURCE_GROUP}", "GET", None)
        resp = api_client.call_api("GET", host + f"/apis/{RESOURCE_GROUP}", header_params=headers, _request_timeout=(10, 30))
        resp.read()
    except Exception as exc:  # noqa: BLE001 - transport errors are reported as one line
        raise DiscoveryUnavailable(f"cannot reach the Kubernetes API at {host}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if resp.status == 404:
        raise UserError(f"{host} does not serve {RESOURCE_GROUP}: DRA is not enabled on this cluster (Kubernetes 1.34+ serves v1 by default)")
    if resp.status in (401, 403, 429) or resp.status >= 500:
        raise DiscoveryUnavailable(f"discovery of {RESOURCE_GROUP} at {host} answered HTTP {resp.status}")
    if not 200 <= resp.status < 300:
        raise UserError(f"discovery of {RESOURCE_GROUP} at {host} failed with HTTP {resp.status}")
    group = json.loads(resp.data)
    served = [v.get("version") for v in group.get("versions", [])]
    for version in PREFERRED_RESOURCE_VERSIONS:
        if version in served:
            return version
    raise UserError(f"{RESOURCE_GROUP} is served only as {', '.join(served) or 'nothing'}; draudit reads v1, v1beta2 or v1beta1 (Kubernetes 1.32+)")


def watched_kinds(resource_version: str) -> list[KindSpec]:
    """The four kinds the collector records, with ``resource.k8s.io`` at ``resource_version``."""
    return [
        KindSpec("DeviceClass", RESOURCE_GROUP, resource_version, "deviceclasses", False),
        KindSpec("ResourceSlice", RESOURCE_GROUP, resource_version, "resourceslices", False),
        KindSpec("ResourceClaim", RESOURCE_GROUP, resource_version, "resourceclaims", True),
        KindSpec("Pod", "", "v1", "pods", True),
    ]
