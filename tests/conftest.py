"""Fixtures: the SLURM test bed, brought up once per session when needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from lanes import LANE_VARIABLE, current_lane, in_lane
from testbed_support import REPO, TESTBED, Testbed, require, up_options

TESTBED_DIR = os.environ.get("ERAY_TESTBED_DIR", "/tmp/eray-testbed")
#: the bed's place beside others on this machine (``slurm-testbed up --net``): a lane's own
TESTBED_NET = os.environ.get("ERAY_TESTBED_NET", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``ERAY_TEST_LANE`` (``scripts/live-lanes``) only the lane's modules run."""
    try:
        lane = current_lane()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if lane is None:
        return
    keep = [item for item in items if in_lane(item.path.stem, lane)]
    gone = [item for item in items if not in_lane(item.path.stem, lane)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    lane = os.environ.get(LANE_VARIABLE)
    return f"lane {lane}: test bed {TESTBED_DIR} (net {TESTBED_NET})" if lane else None


@pytest.fixture
def bindir(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A directory first on PATH for fake SLURM commands (the logic around the commands,
    not SLURM: live tests drive the test bed), with retries 10 ms apart."""

    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    from eray_provider.slurm import client as slurm_cli

    monkeypatch.setattr(slurm_cli, "RETRY_DELAY", 0.01)
    return d


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """A running test bed; reused when one is up, torn down only if this session started it."""
    if os.geteuid() != 0:
        require("the SLURM test bed needs root (network namespaces, slurmd)")
    status = subprocess.run([str(TESTBED), "--dir", TESTBED_DIR, "status"], capture_output=True, text=True)
    started = False
    slurm = os.environ.get("ERAY_TESTBED_SLURM", "22.05")  # or 25.11 (`make test`)
    if status.returncode != 0:
        up = subprocess.run(
            [str(TESTBED), "--dir", TESTBED_DIR, "up", *up_options(TESTBED_NET, slurm)],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if up.returncode != 0:
            require(f"the SLURM test bed did not come up: {up.stderr.strip()[-3000:]}")
        started = True
    bed = Testbed(TESTBED_DIR)
    version = bed.run(["scontrol", "--version"], check=False).stdout.strip()  # "slurm[-wlm] 25.11.7"
    if not re.search(rf"\b{re.escape(slurm)}\.\d+$", version):
        require(
            f"the running test bed is {version!r}, not the Slurm {slurm} asked for (ERAY_TESTBED_SLURM): "
            f"run `scripts/slurm-testbed --dir {TESTBED_DIR} down` first"
        )
    seen = bed.on_node("node1", f"test -x {sys.executable} && echo visible", check=False).stdout
    if "visible" not in seen:
        require(
            f"the running test bed does not share {REPO} with its nodes: run "
            f"`scripts/slurm-testbed --dir {TESTBED_DIR} down` (the tests bring it up with --share)"
        )
    # in-process code (load_allocation, the provider) runs scontrol with os.environ
    previous = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH")}
    os.environ.update({k: bed.env[k] for k in previous})
    yield bed
    for k, v in previous.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if started:
        subprocess.run([str(TESTBED), "--dir", TESTBED_DIR, "down"], timeout=120)


@pytest.fixture
def allocation(testbed: Testbed) -> Iterator[str]:
    """A fresh 3-node allocation (2 CPUs, 2 GPUs and 1500 MB per node), cancelled after."""
    job = testbed.salloc("-N3", "-c2", "--gpus-per-node=2", "--mem=1500", "-J", "eray-test")
    yield job
    testbed.cancel(job)
