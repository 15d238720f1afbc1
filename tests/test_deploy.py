"""The in-cluster manifests (deploy/): rendered, schema-valid for Kubernetes 1.34, least privilege.

Rendering uses ``kubectl kustomize`` when kubectl is installed; otherwise a small reader below that
understands exactly the Kustomize features deploy/ uses (resources, namespace, labels, images,
configMap/secret generators, strategic-merge patches with ``$patch: delete``). When kubectl is
present a test checks that both renderings agree, so the fallback cannot drift silently.

Sources: dra-api.md §8.2 (read-only RBAC for the watcher), watch-semantics.md §13 (Lease verbs:
get, create, update), the Pod Security "restricted" profile, collector/settings.py ENV_VARS.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tomllib
from functools import lru_cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from sqlalchemy.engine import make_url

from collector.settings import ENV_VARS, load_settings

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "deploy" / "base"
TRIAL = ROOT / "deploy" / "overlays" / "trial"
DOCS = ROOT / "docs" / "deploy.md"
K8S_VERSION = "1.34"
# Environment variables the collector's containers may set besides DRAUDIT_*: the image's standard
# ones (TZ for the leader-election clock, KUBECONFIG read by load_settings).
STANDARD_ENV = {"TZ", "KUBECONFIG"}

WATCHED = {
    ("resource.k8s.io", "resourceclaims"),
    ("resource.k8s.io", "resourceclaimtemplates"),
    ("resource.k8s.io", "resourceslices"),
    ("resource.k8s.io", "deviceclasses"),
    ("", "pods"),
}
READ_VERBS = {"get", "list", "watch"}
LEASE_VERBS = {"get", "create", "update"}


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------

def _kubectl_render(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _smp_merge(target, patch):
    """Strategic merge for the shapes deploy/ patches: maps merge; lists of maps merge by their
    merge key (``name``, else ``mountPath``); ``$patch: delete`` removes the matching item."""
    if isinstance(target, dict) and isinstance(patch, dict):
        out = dict(target)
        for key, value in patch.items():
            out[key] = _smp_merge(target[key], value) if key in target else value
        return out
    if isinstance(target, list) and isinstance(patch, list) and all(isinstance(p, dict) for p in patch):
        out = [copy.deepcopy(t) for t in target]
        for item in patch:
            mkey = "name" if "name" in item else "mountPath"
            idx = next((i for i, t in enumerate(out) if isinstance(t, dict) and t.get(mkey) == item[mkey]), None)
            if item.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append(item)
            else:
                out[idx] = _smp_merge(out[idx], item)
        return out
    return patch


def _read_render(path: Path) -> list[dict]:
    """Render a kustomization by reading its YAML (no hash suffixes on generated names)."""
    kz = yaml.safe_load((path / "kustomization.yaml").read_text())
    objects: list[dict] = []
    for res in kz.get("resources", []):
        target = (path / res).resolve()
        if target.is_dir():
            objects.extend(_read_render(target))
        else:
            objects.extend(d for d in yaml.safe_load_all(target.read_text()) if d)
    for gen in kz.get("configMapGenerator", []):
        data: dict[str, str] = {}
        for env_file in gen.get("envs", []):
            for line in (path / env_file).read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    k, _, v = line.partition("=")
                    data[k.strip()] = v
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for gen in kz.get("secretGenerator", []):
        data = dict(lit.split("=", 1) for lit in gen.get("literals", []))
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": gen["name"]}, "stringData": data})
    for patch in kz.get("patches", []):
        body = yaml.safe_load(patch["patch"])
        sel = patch["target"]
        for i, obj in enumerate(objects):
            if obj["kind"] == sel["kind"] and obj["metadata"]["name"] == sel["name"]:
                objects[i] = _smp_merge(obj, body)
    images = {img["name"]: f"{img.get('newName', img['name'])}:{img['newTag']}" for img in kz.get("images", [])}
    for obj in objects:
        if kz.get("namespace") and obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            obj["metadata"]["namespace"] = kz["namespace"]
        for spec in _pod_specs(obj):
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                c["image"] = images.get(c["image"], c["image"])
    return objects


@lru_cache(maxsize=None)
def _rendered(which: str, how: str) -> tuple:
    path = BASE if which == "base" else TRIAL
    objs = _kubectl_render(path) if how == "kubectl" else _read_render(path)
    return tuple(objs)


def render(which: str) -> list[dict]:
    """Objects of ``deploy/base`` (``which="base"``) or the trial overlay, as deep copies."""
    how = "kubectl" if shutil.which("kubectl") else "read"
    return copy.deepcopy(list(_rendered(which, how)))


def _pod_specs(obj: dict) -> list[dict]:
    if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [obj["spec"]["template"]["spec"]]
    return []


def _one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _by_logical_name(objs: list[dict], kind: str, logical: str) -> dict | None:
    """The object named ``logical`` or ``logical-<kustomize hash>``."""
    for o in objs:
        if o["kind"] == kind and re.fullmatch(re.escape(logical) + r"(-[a-z0-9]{10})?", o["metadata"]["name"]):
            return o
    return None


def _collector(objs: list[dict]) -> tuple[dict, dict]:
    dep = _one(objs, "Deployment", "draudit")
    spec = dep["spec"]["template"]["spec"]
    return dep, next(c for c in spec["containers"] if c["name"] == "draudit")


def _data_keys(obj: dict) -> set[str]:
    return set(obj.get("data") or {}) | set(obj.get("stringData") or {}) | set(obj.get("binaryData") or {})


def _secret_value(obj: dict, key: str) -> str:
    import base64

    if key in (obj.get("stringData") or {}):
        return obj["stringData"][key]
    return base64.b64decode(obj["data"][key]).decode()


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["base", "trial"])
def test_every_object_validates_against_kubernetes_1_34_strict_schemas(which):
    objs = render(which)
    kinds = sorted(o["kind"] for o in objs)
    expected = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                "Deployment", "Service", "ConfigMap"}
    if which == "trial":
        expected |= {"StatefulSet", "Secret"}
    assert set(kinds) == expected
    for obj in objs:
        version = kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert version == K8S_VERSION, f"{obj['kind']}/{obj['metadata']['name']} checked against {version}"


def test_the_schema_check_rejects_a_broken_deployment():
    """The validator is live: an unknown field and a wrongly typed replica count are refused."""
    dep, container = _collector(render("base"))
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {"httpGet": {"path": "/livez", "port": "http"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    bad = copy.deepcopy(dep)
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: only the YAML reader is available")
@pytest.mark.parametrize("which", ["base", "trial"])
def test_the_yaml_reader_renders_what_kubectl_kustomize_renders(which):
    kubectl = list(_rendered(which, "kubectl"))
    reader = list(_rendered(which, "read"))
    hashed = {o["metadata"]["name"] for o in kubectl if o["kind"] in ("ConfigMap", "Secret")}

    def normalise(value):
        if isinstance(value, dict):
            value = {k: normalise(v) for k, v in value.items()
                     if k not in ("labels",) or not isinstance(v, dict)}
            if "data" in value and value.get("kind") == "Secret":
                value["stringData"] = {k: _secret_value(value, k) for k in value["data"]}
                del value["data"]
            return value
        if isinstance(value, list):
            return [normalise(v) for v in value]
        if isinstance(value, str) and value in hashed:
            return value.rsplit("-", 1)[0]
        return value

    def key(o):
        return (o["kind"], o["metadata"]["name"])

    def strip_labels(objs):
        out = []
        for o in objs:
            o = copy.deepcopy(o)
            o["metadata"].pop("labels", None)
            out.append(normalise(o))
        return sorted(out, key=key)

    assert strip_labels(reader) == strip_labels(kubectl)


# --------------------------------------------------------------------------------------------
# RBAC
# --------------------------------------------------------------------------------------------

def _grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("which", ["base", "trial"])
def test_cluster_role_grants_exactly_read_on_the_watched_kinds(which):
    objs = render(which)
    roles = [o for o in objs if o["kind"] == "ClusterRole"]
    assert len(roles) == 1
    rules = roles[0]["rules"]
    assert _grants(rules) == {(g, r, v) for g, r in WATCHED for v in READ_VERBS}
    for rule in rules:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert not rule.get("nonResourceURLs")
        assert not rule.get("resourceNames")  # a watch over all objects cannot be limited by name
    binding = _one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": roles[0]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "draudit", "namespace": "draudit"}]


@pytest.mark.parametrize("which", ["base", "trial"])
def test_lease_role_allows_only_get_create_update_on_the_configured_lease(which):
    objs = render(which)
    role = _one(objs, "Role")
    assert role["metadata"]["namespace"] == "draudit"
    assert _grants(role["rules"]) <= {("coordination.k8s.io", "leases", v) for v in LEASE_VERBS}
    assert {v for _, _, v in _grants(role["rules"])} == LEASE_VERBS
    config = _by_logical_name(objs, "ConfigMap", "draudit-config")
    lease_name = config["data"]["DRAUDIT_LEASE_NAME"]
    for rule in role["rules"]:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule["resourceNames"] == [lease_name]
    binding = _one(objs, "RoleBinding")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "draudit", "namespace": "draudit"}]
    # The Lease namespace the collector uses is its own: the Role's namespace.
    dep, container = _collector(objs)
    env = {e["name"]: e for e in container["env"]}
    assert env["DRAUDIT_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert dep["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "draudit"


@pytest.mark.parametrize("which", ["base", "trial"])
def test_no_other_rbac_objects_exist(which):
    kinds = [o["kind"] for o in render(which)]
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert kinds.count(kind) == 1, kind


# --------------------------------------------------------------------------------------------
# The collector's Deployment
# --------------------------------------------------------------------------------------------

def _all_containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("which", ["base", "trial"])
def test_every_container_runs_restricted(which):
    for obj in render(which):
        for spec in _pod_specs(obj):
            psc = spec["securityContext"]
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
            assert psc["seccompProfile"]["type"] == "RuntimeDefault"
            for c in _all_containers(spec):
                sc = c["securityContext"]
                where = f"{obj['metadata']['name']}/{c['name']}"
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc["readOnlyRootFilesystem"] is True, where
                assert sc["runAsNonRoot"] is True, where
                assert sc["capabilities"] == {"drop": ["ALL"]}, where
                assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
                for bound in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(c["resources"][bound]), f"{where} {bound}"


def test_base_deployment_runs_two_leader_elected_replicas_with_probes():
    objs = render("base")
    dep, container = _collector(objs)
    assert dep["spec"]["replicas"] == 2
    assert container["args"] == ["run"]
    port = next(p for p in container["ports"] if p["name"] == "http")
    assert port["containerPort"] == 8080
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = {e["name"]: e for e in container["env"]}
    assert env["DRAUDIT_LEADER_ELECT"]["value"] == "true"
    assert env["DRAUDIT_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The schema migration runs before the collector, from the same image, on the same database.
    init = {c["name"]: c for c in dep["spec"]["template"]["spec"]["initContainers"]}
    assert init["db-upgrade"]["args"] == ["db", "upgrade"]
    assert init["db-upgrade"]["image"] == container["image"]
    db_env = {e["name"]: e for e in init["db-upgrade"]["env"]}
    assert db_env["DRAUDIT_DATABASE_URL"] == env["DRAUDIT_DATABASE_URL"]


def test_service_exposes_the_collector_port_to_its_pods():
    objs = render("base")
    dep, container = _collector(objs)
    svc = _one(objs, "Service", "draudit")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8080 and port["targetPort"] == "http"
    assert any(p["name"] == "http" for p in container["ports"])


def _pod_environment(objs: list[dict], container: dict, pod_name: str, namespace: str) -> dict[str, str]:
    """The environment the kubelet would give ``container`` (literal, ConfigMap, Secret, fieldRef)."""
    environ: dict[str, str] = {}
    for src in container.get("envFrom", []):
        ref = src.get("configMapRef") or src.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in src else "Secret"
        obj = _one(objs, kind, ref["name"])
        environ.update({k: (obj["data"][k] if kind == "ConfigMap" else _secret_value(obj, k)) for k in _data_keys(obj)})
    for e in container.get("env", []):
        if "value" in e:
            environ[e["name"]] = e["value"]
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            environ[e["name"]] = {"metadata.name": pod_name, "metadata.namespace": namespace}[vf["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in vf:
            environ[e["name"]] = _secret_value(_one(objs, "Secret", vf["secretKeyRef"]["name"]), vf["secretKeyRef"]["key"])
        else:
            ref = vf["configMapKeyRef"]
            environ[e["name"]] = _one(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
    return environ


def _mounted_file(spec: dict, container: dict, path: str) -> tuple[dict, str] | None:
    """The volume and key a file path resolves to through ``container``'s mounts."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in container["volumeMounts"]:
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            return volumes[m["name"]], path[len(prefix):]
    return None


def test_the_collector_environment_builds_valid_settings_with_every_path_mounted():
    """Feed the trial pod's real environment to collector.settings.load_settings."""
    objs = render("trial")
    dep, container = _collector(objs)
    spec = dep["spec"]["template"]["spec"]
    environ = _pod_environment(objs, container, pod_name="draudit-5d8f7c9b4-x2k4q", namespace="draudit")
    settings = load_settings(environ)
    assert settings.leader_elect is True
    assert settings.identity == "draudit-5d8f7c9b4-x2k4q"
    assert settings.lease_namespace == "draudit"
    assert settings.http_port == next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert make_url(settings.database_url).get_backend_name() == "postgresql"
    # Writable paths under a read-only root filesystem are emptyDirs.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for path in (str(settings.pack_dir), "/tmp"):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
        assert not mounts[path].get("readOnly"), path
    # The policy bundle directory is the one the policy-bundle init container fills.
    bundle_mount = mounts[str(settings.policy_bundle)]
    init = next(c for c in spec["initContainers"] if c["name"] == "policy-bundle")
    assert any(m["name"] == bundle_mount["name"] and m["mountPath"] == str(settings.policy_bundle)
               for m in init["volumeMounts"])
    assert "emptyDir" in volumes[bundle_mount["name"]]
    # The ingest token file is a key of a mounted Secret that exists in the overlay.
    volume, rel = _mounted_file(spec, container, settings.ingest_token_file)
    secret = _one(objs, "Secret", volume["secret"]["secretName"])
    item = next(i for i in volume["secret"]["items"] if i["path"] == rel)
    assert item["key"] in _data_keys(secret)
    assert _secret_value(secret, item["key"]) != ""


def test_base_mounts_the_signing_key_from_a_secret_and_the_trial_drops_it():
    objs = render("base")
    dep, container = _collector(objs)
    spec = dep["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    volume, rel = _mounted_file(spec, container, env["DRAUDIT_SIGN_KEY"])
    assert volume["secret"]["secretName"] == "draudit-sign-key"
    assert [i["key"] for i in volume["secret"]["items"]] == [rel]
    assert not volume["secret"].get("optional")

    dep, container = _collector(render("trial"))
    assert "DRAUDIT_SIGN_KEY" not in {e["name"] for e in container["env"]}
    assert all(v["name"] != volume.get("name") for v in dep["spec"]["template"]["spec"]["volumes"])
    assert all("sign" not in m["mountPath"] for m in container["volumeMounts"])


@pytest.mark.parametrize("which", ["base", "trial"])
def test_every_collector_env_name_is_read_by_the_settings_object(which):
    objs = render(which)
    config = _by_logical_name(objs, "ConfigMap", "draudit-config")
    names = set(config["data"])
    for obj in objs:
        for spec in _pod_specs(obj):
            for c in _all_containers(spec):
                if not c["image"].startswith("draudit:"):
                    continue
                names |= {e["name"] for e in c.get("env", [])}
    unknown = names - set(ENV_VARS) - STANDARD_ENV
    assert not unknown, f"not read by collector.settings: {sorted(unknown)}"
    # And every value in the ConfigMap parses (types and ranges are checked by Settings).
    load_settings(config["data"])


# --------------------------------------------------------------------------------------------
# References: what the trial contains, what the base needs from the operator
# --------------------------------------------------------------------------------------------

def _references(objs: list[dict]) -> set[tuple[str, str, str | None, bool]]:
    """(kind, name, key or None, optional) for every Secret/ConfigMap a pod template uses."""
    refs = set()
    for obj in objs:
        for spec in _pod_specs(obj):
            for c in _all_containers(spec):
                for src in c.get("envFrom", []):
                    for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                        if field in src:
                            refs.add((kind, src[field]["name"], None, bool(src[field].get("optional"))))
                for e in c.get("env", []):
                    vf = e.get("valueFrom", {})
                    for kind, field in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                        if field in vf:
                            refs.add((kind, vf[field]["name"], vf[field]["key"], bool(vf[field].get("optional"))))
            for v in spec.get("volumes", []):
                if "secret" in v:
                    src, kind, name = v["secret"], "Secret", v["secret"]["secretName"]
                elif "configMap" in v:
                    src, kind, name = v["configMap"], "ConfigMap", v["configMap"]["name"]
                else:
                    continue
                keys = [i["key"] for i in src.get("items", [])] or [None]
                refs |= {(kind, name, k, bool(src.get("optional"))) for k in keys}
    return refs


def _missing(objs: list[dict]) -> set[tuple[str, str, str | None, bool]]:
    present = {(o["kind"], o["metadata"]["name"]): _data_keys(o) for o in objs if o["kind"] in ("Secret", "ConfigMap")}
    return {r for r in _references(objs)
            if (r[0], r[1]) not in present or (r[2] is not None and r[2] not in present[(r[0], r[1])])}


def test_every_required_reference_resolves_in_the_trial_overlay():
    objs = render("trial")
    missing = _missing(objs)
    assert {m for m in missing if not m[3]} == set(), missing
    # The only optional one is the operator's own policy bundle ConfigMap.
    assert missing == {("ConfigMap", "draudit-policies", None, True)}


def test_base_needs_exactly_the_documented_secrets():
    """What the base references but does not contain is what docs/deploy.md tells operators to create."""
    missing = _missing(render("base"))
    assert {(k, n, key) for k, n, key, optional in missing if not optional} == {
        ("Secret", "draudit-database", "url"),
        ("Secret", "draudit-ingest-token", "token"),
        ("Secret", "draudit-sign-key", "private-key.pem"),
    }
    docs = DOCS.read_text()
    for kind, name, key, optional in missing:
        if kind == "Secret":
            assert re.search(rf"kubectl -n draudit create secret generic {re.escape(name)}\b[^\n]*--from-\w+={re.escape(key)}=", docs), (name, key)
        else:
            assert f"kubectl -n draudit create configmap {name}" in docs, name


def test_trial_database_url_points_at_the_trial_postgres():
    objs = render("trial")
    dep, container = _collector(objs)
    ref = next(e for e in container["env"] if e["name"] == "DRAUDIT_DATABASE_URL")["valueFrom"]["secretKeyRef"]
    url = make_url(_secret_value(_one(objs, "Secret", ref["name"]), ref["key"]))
    sts = _one(objs, "StatefulSet", "draudit-postgres")
    svc = _one(objs, "Service", url.host)
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    pg = sts["spec"]["template"]["spec"]["containers"][0]
    assert pg["image"].split(":")[0] == "postgres"
    assert url.port == svc["spec"]["ports"][0]["port"] == next(p["containerPort"] for p in pg["ports"])
    creds = _one(objs, "Secret", pg["envFrom"][0]["secretRef"]["name"])
    assert (url.username, url.password, url.database) == (
        _secret_value(creds, "POSTGRES_USER"), _secret_value(creds, "POSTGRES_PASSWORD"), _secret_value(creds, "POSTGRES_DB"))
    probe = " ".join(pg["readinessProbe"]["exec"]["command"])
    assert "pg_isready" in probe


def test_image_tag_is_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for which in ("base", "trial"):
        _, container = _collector(render(which))
        assert container["image"] == f"draudit:{version}"


# --------------------------------------------------------------------------------------------
# Policy bundle: the documented ConfigMap and the init container that copies it
# --------------------------------------------------------------------------------------------

def _policy_init_script() -> str:
    dep, _ = _collector(render("base"))
    init = next(c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == "policy-bundle")
    assert init["command"][:2] == ["/bin/sh", "-ec"]
    return init["command"][2]


def _run_policy_init(tmp_path: Path, configmap_dir: Path, image_bundle: Path) -> Path:
    dst = tmp_path / "bundle"
    dst.mkdir()
    script = (_policy_init_script()
              .replace("/etc/draudit/policies-configmap", str(configmap_dir))
              .replace("/var/lib/draudit/policies", str(dst))
              .replace("/opt/draudit/policies", str(image_bundle)))
    # The image's PATH (python:3.11-slim): coreutils in /usr/bin, /bin.
    subprocess.run(["/bin/sh", "-ec", script], check=True, capture_output=True, text=True,
                   env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    return dst


def _configmap_volume(root: Path, files: dict[str, str]) -> Path:
    """A directory laid out like the kubelet's ConfigMap volume: ..<timestamp>/, ..data → it,
    and one symlink per key pointing into ..data/."""
    root.mkdir()
    stamp = root / "..2025_06_04_10_15_00.123456789"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
    (root / "..data").symlink_to(stamp.name)
    for name in files:
        (root / name).symlink_to(f"..data/{name}")
    return root


def test_policy_init_copies_the_configmap_bundle_as_plain_files(tmp_path):
    files = {".manifest": '{"revision":"2025-06-04","roots":["draudit"]}',
             "isolation.rego": "package draudit.isolation\n", "data.json": '{"draudit":{}}'}
    cm = _configmap_volume(tmp_path / "cm", files)
    image_bundle = tmp_path / "image"
    image_bundle.mkdir()
    (image_bundle / "other.rego").write_text("package other\n")
    dst = _run_policy_init(tmp_path, cm, image_bundle)
    assert sorted(p.name for p in dst.iterdir()) == sorted(files)
    for name, text in files.items():
        assert not (dst / name).is_symlink() and (dst / name).read_text() == text


def test_the_shipped_bundle_survives_the_configmap_round_trip(tmp_path):
    """policies/ → ConfigMap volume → policy-bundle init container → the same bundle (same digest)."""
    from collector.policy.bundle import load_bundle

    source = ROOT / "policies"
    files = {p.name: p.read_text() for p in source.iterdir() if p.is_file()}
    cm = _configmap_volume(tmp_path / "cm", files)
    dst = _run_policy_init(tmp_path, cm, tmp_path / "no-image-bundle")
    copied, original = load_bundle(dst), load_bundle(source)
    assert copied.digest == original.digest
    assert copied.revision == original.revision
    assert len(copied.modules) == len(original.modules) > 0


def test_policy_init_falls_back_to_the_bundle_in_the_image(tmp_path):
    cm = tmp_path / "cm"
    cm.mkdir()  # an optional ConfigMap that does not exist mounts as an empty directory
    image_bundle = tmp_path / "image"
    (image_bundle / "lib").mkdir(parents=True)
    (image_bundle / ".manifest").write_text('{"revision":"image"}')
    (image_bundle / "lib" / "intervals.rego").write_text("package draudit.lib\n")
    dst = _run_policy_init(tmp_path, cm, image_bundle)
    assert (dst / ".manifest").read_text() == '{"revision":"image"}'
    assert (dst / "lib" / "intervals.rego").read_text() == "package draudit.lib\n"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_documented_policies_configmap_command_captures_the_whole_bundle():
    """`kubectl create configmap --from-file=policies/` keeps top-level files only; the bundle must
    therefore be flat, fit a ConfigMap (1 MiB), and the result must be a valid 1.34 object."""
    docs = DOCS.read_text()
    cmd = re.search(r"^\s*(kubectl -n draudit create configmap draudit-policies [^\n]*)$", docs, re.M).group(1)
    argv = cmd.replace("--dry-run=client -o yaml | kubectl apply -f -", "").split()
    argv += ["--dry-run=client", "-o", "yaml"]
    out = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    cm = yaml.safe_load(out)
    cm["metadata"].pop("creationTimestamp", None)
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    bundle = ROOT / "policies"
    files = [p for p in bundle.rglob("*") if p.is_file()]
    nested = [str(p.relative_to(bundle)) for p in files if p.parent != bundle]
    assert not nested, f"a ConfigMap cannot hold nested bundle files: {nested}"
    assert _data_keys(cm) == {p.name for p in files}
    assert sum(p.stat().st_size for p in files) < 1024 * 1024



# --------------------------------------------------------------------------------------------
# docs/shippers.md: the snippets point at this Service with the bearer token
# --------------------------------------------------------------------------------------------

SHIPPERS = ROOT / "docs" / "shippers.md"


def _fences(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SHIPPERS.read_text(), re.S)


def _fluent_bit_sections(text: str) -> list[tuple[str, dict[str, str]]]:
    """Fluent Bit classic configuration: ``[SECTION]`` then ``Key Value`` lines (keys case-insensitive)."""
    sections: list[tuple[str, dict[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if re.fullmatch(r"\[[A-Z]+\]", line):
            sections.append((line[1:-1], {}))
        elif line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            sections[-1][1][key.lower()] = value.strip()
    return sections


def _service_address() -> tuple[str, int]:
    svc = _one(render("base"), "Service", "draudit")
    return f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc", svc["spec"]["ports"][0]["port"]


def test_fluent_bit_snippet_sends_json_lines_to_the_ingest_endpoint():
    (text,) = _fences("ini")
    sections = _fluent_bit_sections(text)
    tail = next(s for n, s in sections if n == "INPUT" and s["name"] == "tail")
    k8s = next(s for n, s in sections if n == "FILTER" and s["name"] == "kubernetes")
    out = next(s for n, s in sections if n == "OUTPUT" and s["name"] == "http")
    host, port = _service_address()
    assert (out["host"], int(out["port"]), out["uri"]) == (host, port, "/v1/ingest")
    assert out["format"] == "json_lines" and out["compress"] == "gzip"
    assert re.fullmatch(r"Authorization Bearer \$\{DRAUDIT_INGEST_TOKEN\}", out["header"])
    assert out["match"] == k8s["match"] == tail["tag"]
    # The kubernetes filter reads pod/namespace/container from the tag: prefix = tag + path dirs.
    tag_prefix = tail["tag"].rstrip("*")
    path_dir = tail["path"].rsplit("/", 1)[0]
    assert k8s["kube_tag_prefix"] == tag_prefix + path_dir.strip("/").replace("/", ".") + "."
    assert tail["multiline.parser"] == "cri"
    assert k8s["merge_log"] == "On" and k8s["keep_log"] == "On" and k8s["merge_log_key"]


def test_vector_and_otel_snippets_send_to_the_service_with_the_bearer_token():
    from urllib.parse import urlsplit

    host, port = _service_address()
    docs = [yaml.safe_load(t) for t in _fences("yaml")]
    (vector,) = [d for d in docs if isinstance(d, dict) and "sinks" in d]
    (otel,) = [d for d in docs if isinstance(d, dict) and "exporters" in d]
    sink = vector["sinks"]["draudit"]
    assert sink["type"] == "http" and sink["inputs"] == list(vector["sources"])
    url = urlsplit(sink["uri"])
    assert (url.hostname, url.port, url.path) == (host, port, "/v1/ingest")
    assert sink["encoding"]["codec"] == "json" and sink["framing"]["method"] == "newline_delimited"
    assert sink["auth"] == {"strategy": "bearer", "token": "${DRAUDIT_INGEST_TOKEN}"}
    assert sink["compression"] == "gzip"

    exporter_name = next(k for k in otel["exporters"] if k.split("/")[0] == "otlphttp")
    exporter = otel["exporters"][exporter_name]
    url = urlsplit(exporter["logs_endpoint"])
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", host, port, "/v1/logs")
    assert exporter["headers"]["Authorization"] == "Bearer ${env:DRAUDIT_INGEST_TOKEN}"
    k8sattr = otel["processors"]["k8sattributes"]
    assert {"k8s.pod.uid", "k8s.pod.name", "k8s.namespace.name", "k8s.container.name",
            "k8s.node.name"} <= set(k8sattr["extract"]["metadata"])
    assert k8sattr["pod_association"][0]["sources"] == [{"from": "resource_attribute", "name": "k8s.pod.uid"}]
    (pipeline,) = otel["service"]["pipelines"].values()
    assert pipeline["exporters"] == [exporter_name]
    assert set(pipeline["receivers"]) <= set(otel["receivers"]) and set(pipeline["processors"]) <= set(otel["processors"])
    # Association by connection needs the sender's IP, which batching drops.
    assert pipeline["processors"].index("k8sattributes") < pipeline["processors"].index("batch")
    assert set(otel["service"]["extensions"]) <= set(otel["extensions"])
