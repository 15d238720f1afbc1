"""docker-compose.yml and the Dockerfile, checked by parsing (no Docker engine runs here).

What is checked is the wiring a `docker compose up` depends on: the services and their official
images, health checks behind every `service_healthy` condition, the collector's environment (only
names collector/settings.py reads, URLs that name the right services and ports, values the real
settings object accepts), and a Dockerfile that installs every package pyproject.toml declares and
starts the `draudit` console script.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from sqlalchemy.engine import make_url

from collector.settings import ENV_VARS, load_settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
STANDARD_ENV = {"KUBECONFIG", "TZ"}

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose-file interpolation (``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}``), as
    specified by the Compose Specification, section "Interpolation".

    Raises:
        KeyError: a ``${VAR:?error}`` variable is unset or empty (compose refuses to start).
    """
    def sub(m: re.Match) -> str:
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        current = environ.get(name)
        if op in (":-", "-"):
            return current if current or (op == "-" and current is not None) else arg
        if op in (":?", "?"):
            if not current:
                raise KeyError(f"{name}: {arg}")
            return current
        return current or ""

    return _VAR.sub(sub, value)


def service_env(name: str, environ: dict[str, str]) -> dict[str, str]:
    env = SERVICES[name].get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v), environ) for k, v in env.items()}


USER_ENV = {"DRAUDIT_INGEST_TOKEN": "3f9c2a7e5b1d4c8f9a0b6e2d7c1f4a3b9e8d5c2a", "HOME": "/home/auditor"}


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, args = line.partition(" ")
            out.append((instr.upper(), args.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    steps = _dockerfile()
    last_from = max(i for i, (instr, _) in enumerate(steps) if instr == "FROM")
    return steps[last_from:]


# --------------------------------------------------------------------------------------------
# Services, images, health
# --------------------------------------------------------------------------------------------

def test_services_and_official_images():
    assert {"postgres", "opa", "collector"} <= set(SERVICES)
    assert re.fullmatch(r"postgres:\d+(\.\d+)?(-[a-z0-9]+)?", SERVICES["postgres"]["image"])
    assert re.fullmatch(r"openpolicyagent/opa:\d+\.\d+\.\d+(-debug)?", SERVICES["opa"]["image"])
    for name in ("collector", "migrate"):
        assert SERVICES[name]["build"] in (".", {"context": "."})
        assert (ROOT / "Dockerfile").is_file()
    assert SERVICES["collector"]["image"] == SERVICES["migrate"]["image"] == f"draudit:{PYPROJECT['project']['version']}"


def test_every_health_condition_has_a_health_check():
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
            if cond["condition"] == "service_healthy":
                test = SERVICES[dep]["healthcheck"]["test"]
                assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, dep
            elif cond["condition"] == "service_completed_successfully":
                assert SERVICES[dep].get("restart", "no") == "no", f"{dep} must run once"
    deps = SERVICES["collector"]["depends_on"]
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["opa"]["condition"] == "service_healthy"
    assert deps["migrate"]["condition"] == "service_completed_successfully"
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(SERVICES["postgres"]["healthcheck"]["test"])


def test_opa_serves_the_policies_directory_as_a_bundle_on_all_interfaces():
    opa = SERVICES["opa"]
    cmd = opa["command"]
    assert cmd[:2] == ["run", "--server"]
    addr = next(a.split("=", 1)[1] for a in cmd if a.startswith("--addr="))
    assert addr.startswith("0.0.0.0:")  # OPA 1.x binds localhost by default
    bundle = cmd[cmd.index("--bundle") + 1]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in opa["volumes"]}
    assert mounts[bundle] == "./policies" and (ROOT / "policies").is_dir()
    health = " ".join(opa["healthcheck"]["test"])
    assert f"127.0.0.1:{addr.split(':')[1]}/health" in health


# --------------------------------------------------------------------------------------------
# The collector's wiring
# --------------------------------------------------------------------------------------------

def test_collector_env_names_are_read_by_the_settings_object():
    for name in ("collector", "migrate"):
        names = set(SERVICES[name]["environment"])
        unknown = names - set(ENV_VARS) - STANDARD_ENV
        assert not unknown, f"{name}: not read by collector.settings: {sorted(unknown)}"


def test_database_url_names_the_postgres_service_and_its_credentials():
    pg = service_env("postgres", USER_ENV)
    for name in ("collector", "migrate"):
        url = make_url(service_env(name, USER_ENV)["DRAUDIT_DATABASE_URL"])
        assert url.get_backend_name() == "postgresql"
        assert url.host == "postgres" and url.port == 5432
        assert (url.username, url.password, url.database) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
    # An operator's password reaches both sides.
    env = dict(USER_ENV, DRAUDIT_POSTGRES_PASSWORD="s3cret-from-operator")
    assert make_url(service_env("collector", env)["DRAUDIT_DATABASE_URL"]).password == "s3cret-from-operator"
    assert service_env("postgres", env)["POSTGRES_PASSWORD"] == "s3cret-from-operator"


def test_opa_url_names_the_opa_service_and_port():
    opa = urlsplit(service_env("collector", USER_ENV)["DRAUDIT_OPA_URL"])
    port = next(a for a in SERVICES["opa"]["command"] if a.startswith("--addr=")).rsplit(":", 1)[1]
    assert (opa.scheme, opa.hostname, opa.port) == ("http", "opa", int(port))


def test_collector_environment_builds_valid_settings():
    env = service_env("collector", USER_ENV)
    settings = load_settings(env)
    assert settings.opa_url == "http://opa:8181"
    assert settings.resolved_ingest_token() == USER_ENV["DRAUDIT_INGEST_TOKEN"]
    assert settings.cluster == "default"
    # KUBECONFIG is the file mounted from the host.
    mounts = {}
    for m in SERVICES["collector"]["volumes"]:
        src, dst, *_ = interpolate(m, USER_ENV).split(":")
        mounts[dst] = src
    assert settings.kubeconfig == env["KUBECONFIG"] and env["KUBECONFIG"] in mounts
    assert mounts[env["KUBECONFIG"]] == "~/.kube/config"
    assert interpolate(SERVICES["collector"]["volumes"][0], dict(USER_ENV, KUBECONFIG="/srv/kube/audit.yaml")).startswith("/srv/kube/audit.yaml:")
    # The policy bundle path is the working tree's policies/, mounted.
    assert mounts[str(settings.policy_bundle)] == "./policies"
    # The published port is the one the settings object listens on.
    published = [p for p in SERVICES["collector"]["ports"]]
    assert published == [f"127.0.0.1:{settings.http_port}:{settings.http_port}"]


def test_compose_refuses_to_start_without_an_ingest_token():
    with pytest.raises(KeyError, match="DRAUDIT_INGEST_TOKEN"):
        service_env("collector", {})
    with pytest.raises(KeyError, match="DRAUDIT_INGEST_TOKEN"):
        service_env("collector", {"DRAUDIT_INGEST_TOKEN": ""})


def test_interpolation_follows_the_compose_rules():
    assert interpolate("${A:-x}", {}) == "x"
    assert interpolate("${A:-x}", {"A": ""}) == "x"
    assert interpolate("${A-x}", {"A": ""}) == ""
    assert interpolate("a${A}b", {"A": "1"}) == "a1b"
    with pytest.raises(KeyError):
        interpolate("${A:?missing}", {})


def test_collector_runs_read_only_with_the_images_command():
    col = SERVICES["collector"]
    assert col["read_only"] is True and "/tmp" in col["tmpfs"]
    assert col["command"] == ["run"] and SERVICES["migrate"]["command"] == ["db", "upgrade"]
    pack_dir = service_env("collector", USER_ENV)["DRAUDIT_PACK_DIR"]
    assert any(v.split(":")[1] == pack_dir and not v.startswith((".", "/", "~")) for v in col["volumes"])
    assert set(COMPOSE["volumes"]) >= {v.split(":")[0] for v in col["volumes"] if not v.startswith((".", "/", "~", "$"))}


# --------------------------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------------------------

def test_dockerfile_entrypoint_is_the_console_script_and_cmd_a_real_command():
    steps = dict(_final_stage()[::-1])  # last occurrence wins
    entrypoint = yaml.safe_load(steps["ENTRYPOINT"])
    cmd = yaml.safe_load(steps["CMD"])
    assert entrypoint == ["draudit"]
    assert entrypoint[0] in PYPROJECT["project"]["scripts"]
    assert cmd == ["run"]
    from collector.cli import cli

    for argv in (cmd, SERVICES["collector"]["command"], SERVICES["migrate"]["command"]):
        group = cli
        for word in argv:  # each word is a registered command or subcommand of draudit
            assert word in group.commands, f"draudit {' '.join(argv)}: no command {word!r}"
            group = group.commands[word]


def test_dockerfile_base_user_and_system_packages():
    steps = _final_stage()
    assert re.fullmatch(r"python:3\.11-slim(-bookworm)?", steps[0][1])
    users = [args for instr, args in steps if instr == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    apt = " ".join(args for instr, args in steps if instr == "RUN" and "apt-get install" in args)
    for pkg in ("libpango-1.0-0", "libpangoft2-1.0-0", "libharfbuzz-subset0"):  # WeasyPrint on Debian
        assert pkg in apt.split(), pkg
    env = " ".join(args for instr, args in steps if instr == "ENV")
    names = set(re.findall(r"\b([A-Z][A-Z0-9_]*)=", env))
    assert {n for n in names if n.startswith("DRAUDIT_")} <= set(ENV_VARS)


def test_dockerfile_copies_everything_the_package_build_needs():
    copies = [shlex.split(args) for instr, args in _dockerfile() if instr == "COPY"]
    sources = {src.rstrip("/") for parts in copies if not any(p.startswith("--from") for p in parts)
               for src in parts[:-1]}
    packages = {pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= sources, f"not copied into the image: {packages - sources}"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"], "policies"} <= sources
    # .dockerignore must not drop what is copied.
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for src in sources:
        assert src not in ignored, f".dockerignore excludes {src}, which the Dockerfile copies"
    for src in sources:
        assert (ROOT / src).exists(), src
