"""The shipped Rego bundle (``policies/`` at the repository root) is in the wheel and an installed
draudit finds it: ``draudit policy test`` without a bundle argument works outside the source tree.

The wheel is built with the command the README's users run (``pip wheel``, build isolation, no
dependencies) from a copy of the files the build reads, so no build directory lands in the tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from collector.policy.bundle import load_bundle
from collector.settings import DEFAULT_POLICY_BUNDLE

REPO = Path(__file__).resolve().parent.parent
BUILD_INPUTS = ("pyproject.toml", "README.md", "collector", "reports", "migrations", "policies")


def _bundle_files(root: Path) -> set[str]:
    """The files the bundle digest covers (``bundle.py``): manifest, modules, data documents."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.name in (".manifest", "data.json") or p.suffix == ".rego"}


def test_default_bundle_in_the_source_tree_is_the_repository_policies_directory():
    assert DEFAULT_POLICY_BUNDLE == REPO / "policies"
    assert load_bundle(DEFAULT_POLICY_BUNDLE).revision == load_bundle(REPO / "policies").revision


def test_the_wheel_ships_the_bundle_and_an_installed_draudit_tests_it(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in BUILD_INPUTS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
                   check=True, capture_output=True, timeout=240)
    (wheel,) = wheels.glob("draudit-*.whl")
    prefix = "collector/policy/default_bundle/"
    with zipfile.ZipFile(wheel) as z:
        shipped = {n[len(prefix):] for n in z.namelist() if n.startswith(prefix)}
        site = tmp_path / "site"
        z.extractall(site)
    assert _bundle_files(REPO / "policies") <= shipped and ".manifest" in shipped

    # The unpacked wheel first on the path (dependencies from this environment), run from a
    # directory that has no policies/, with no DRAUDIT_POLICY_BUNDLE.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAUDIT_")}
    env["PYTHONPATH"] = str(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([sys.executable, "-c", "import collector.settings as s; print(s.DEFAULT_POLICY_BUNDLE)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()) == site / "collector" / "policy" / "default_bundle"
    result = subprocess.run([sys.executable, "-m", "collector.cli", "policy", "test"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    revision = load_bundle(REPO / "policies").revision
    assert f"bundle revision {revision}" in result.stdout and "PASS:" in result.stdout
