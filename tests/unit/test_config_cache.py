"""Ray's config cache: only a file that is provably ours is used, and ours is private."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml
from ray.autoscaler._private import commands
from ray.autoscaler._private.util import prepare_config
from testbed_support import REPO

from eray_provider.autoscaler.config_cache import (
    CACHE_VERSION,
    UnsafeConfigCacheError,
    cache_path,
    refuse_unsafe,
    write_private,
)

CONFIG = yaml.safe_load((REPO / "cluster_yamls" / "slurm-cluster.yaml").read_text())


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path


def test_the_cache_path_is_the_one_ray_reads(tmpdir_env) -> None:
    """Ray's own _bootstrap_config loads what we write at cache_path (its hit path)."""
    assert CACHE_VERSION == commands.CONFIG_CACHE_VERSION
    prepared = prepare_config(json.loads(json.dumps(CONFIG)))
    path = cache_path(prepared)
    assert os.path.dirname(path) == str(tmpdir_env)
    write_private(path, {"cluster_name": "c", "provider": {"marker": "ours"}})
    loaded = commands._bootstrap_config(json.loads(json.dumps(CONFIG)))
    assert loaded["provider"]["marker"] == "ours" and loaded["provider"]["_config_cache_path"] == path
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_own_private_file_passes(tmp_path) -> None:
    path = tmp_path / "ray-config-x"
    write_private(str(path), {"a": 1})
    refuse_unsafe(str(path))
    refuse_unsafe(str(tmp_path / "absent"))
    assert json.loads(path.read_text())["config"] == {"a": 1}


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o602])
def test_a_file_others_could_write_or_read_is_refused_and_removed(tmp_path, mode: int) -> None:
    path = tmp_path / "ray-config-x"
    path.write_text("{}")
    path.chmod(mode)
    with pytest.raises(UnsafeConfigCacheError) as e:
        refuse_unsafe(str(path))
    assert str(path) in str(e.value) and f"{mode:04o}" in str(e.value) and "removed" in str(e.value)
    assert not path.exists()


def test_a_symlink_is_refused_not_followed(tmp_path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious")
    target.chmod(0o600)
    link = tmp_path / "ray-config-x"
    link.symlink_to(target)
    with pytest.raises(UnsafeConfigCacheError, match="symbolic link"):
        write_private(str(link), {"a": 1})
    assert target.read_text() == "precious" and not link.is_symlink()
    dangling = tmp_path / "ray-config-y"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafeConfigCacheError):
        write_private(str(dangling), {"a": 1})
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_file_of_another_user_is_refused(tmp_path) -> None:
    path = tmp_path / "ray-config-x"
    path.write_text("{}")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(UnsafeConfigCacheError, match="belongs to uid 65534"):
        refuse_unsafe(str(path))
