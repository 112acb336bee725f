"""The supported Ray range and the differences decided in ``ray_compat``, against the
installed Ray (the suite runs on the oldest and the newest supported Ray)."""

from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from ray.autoscaler._private import commands
from testbed_support import REPO

from eray_provider.runtime import ray_compat
from eray_provider.runtime.ray_compat import UnsupportedRayError, check_version, parse_version


@pytest.mark.parametrize(
    "text, parsed",
    [("2.52.0", (2, 52, 0)), ("2.60.1", (2, 60, 1)), ("2.61.0rc1", (2, 61, 0)), ("3.0", (3, 0, 0))],
)
def test_versions_are_read(text: str, parsed: tuple[int, int, int]) -> None:
    assert parse_version(text) == parsed


def test_an_unreadable_version_is_named() -> None:
    with pytest.raises(UnsupportedRayError, match="'nightly'"):
        parse_version("nightly")


@pytest.mark.parametrize("text", ["2.54.0", "2.57.1", "2.60.0", "2.60.9"])
def test_the_supported_range_passes_silently(text: str) -> None:
    assert check_version(text) is None


@pytest.mark.parametrize("text", ["2.52.0", "2.53.0"])
def test_before_254_the_open_agent_port_is_said(text: str) -> None:
    warning = check_version(text)
    assert warning is not None and f"Ray {text}'s dashboard agent does not check the token" in warning


@pytest.mark.parametrize("text", ["2.51.2", "2.9.3", "1.13.0", "3.0.0"])
def test_outside_the_range_is_refused_naming_both_versions(text: str) -> None:
    with pytest.raises(UnsupportedRayError) as e:
        check_version(text)
    assert f"Ray {text} is installed" in str(e.value) and "2.52 to 2.60" in str(e.value)


def test_a_newer_2x_is_a_warning() -> None:
    warning = check_version("2.61.0")
    assert warning is not None and "2.61.0" in warning and "2.60" in warning


def test_the_installed_ray_is_supported_and_read_right() -> None:
    assert ray.__version__ == ray_compat.RAY_VERSION_TEXT
    warning = check_version(ray.__version__)
    tested = ray_compat.RAY_VERSION[:2] <= ray_compat.NEWEST_TESTED
    assert (warning is None) == (ray_compat.AGENT_HTTP_TOKEN_CHECK and tested), warning


def test_the_cache_digest_is_the_one_this_ray_hashes_with() -> None:
    """Read from the installed Ray's own code, so a release that changes it fails here."""
    source = inspect.getsource(commands._bootstrap_config)
    assert f"hashlib.{ray_compat.CONFIG_CACHE_DIGEST}()" in source
    assert ray_compat.CONFIG_CACHE_DIGEST in hashlib.algorithms_guaranteed


@pytest.mark.parametrize(
    "fake, needle, code",
    [
        ("2.51.0", "Ray 2.51.0 is installed; eray-provider supports Ray 2.52 to 2.60", 1),
        ("2.61.0", "Ray 2.61.0 is newer than the newest release eray-provider was tested with", None),
    ],
)
def test_ray_up_on_a_ray_outside_the_range(tmp_path, fake: str, needle: str, code: int | None) -> None:
    """The real ``ray up`` CLI, with the installed version read as ``fake``: refused in one
    message (no traceback), or warned about and carried on (here to the missing allocation)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.metadata as m\n"
        "_real = m.version\n"
        f"m.version = lambda name: {fake!r} if name == 'ray' else _real(name)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=str(tmp_path), TMPDIR=str(tmp_path))
    ray_cli = Path(sys.executable).with_name("ray")
    proc = subprocess.run(
        [str(ray_cli), "up", "-y", "--no-config-cache", str(REPO / "cluster_yamls" / "slurm-cluster.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert out.count(needle) == 1, out[-3000:]
    if code is not None:
        assert proc.returncode == code and "Traceback" not in out, out[-3000:]
    else:
        assert proc.returncode != 0 and "SLURM_JOB_ID is not set" in out, out[-3000:]


def test_eray_provider_run_and_auto_ray_cluster_refuse_before_starting_anything(monkeypatch) -> None:
    """``batch.start_cluster`` (under both) checks the version before it touches the state."""
    from eray_provider.runtime import batch

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the state was used ({name}) before the version check")

    monkeypatch.setattr(batch, "RAY_VERSION_TEXT", "2.51.0")
    with pytest.raises(UnsupportedRayError, match=r"Ray 2\.51\.0 is installed"):
        batch.start_cluster(Untouchable(), Untouchable(), {}, 1.0)
