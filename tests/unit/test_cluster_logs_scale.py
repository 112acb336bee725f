"""``eray-provider logs CLUSTER`` over 1,000 live nodes, against a fake ``srun`` (as
``bench/provider_scale.py`` fakes SLURM): one step for the job's nodes, not one per node,
every node's output printed in node order."""

from __future__ import annotations

import os
import sys
import time

from eray_provider.runtime.cluster_logs import show_logs
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.runtime.status import state_dirs

#: A fake srun: every task of the step writes its node's "logs" to the --output pattern.
FAKE_SRUN = """#!{python}
import sys
from eray_provider.slurm.hostlist import expand
args = sys.argv[1:]
opt = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
with open({calls!r}, "a") as f:
    f.write(" ".join(args) + "\\n")
for node in expand(opt["--nodelist"]):
    with open(opt["--output"].replace("%N", node), "w") as out:
        out.write(f"== logs of {{node}} ==\\n")
"""


def test_a_thousand_live_nodes_are_read_by_one_step(tmp_path, monkeypatch, capsys) -> None:
    n = 1000
    base = tmp_path / "state"
    state = ClusterState("big", "77", base)
    state.create()
    state.save_cluster_config({"provider": {"python": sys.executable}})
    names = [f"n{i:04d}" for i in range(n)]
    ids = state.add_nodes([(name, "worker", {}) for name in names])
    for node_id, name in zip(ids, names):
        state.write_temp_dirs(node_id, name, [f"/tmp/eray-77-{name}"])
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "srun.calls"
    srun = bindir / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable, calls=str(calls)))
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    start = time.monotonic()
    status = show_logs(base, "big", "77", state_dirs(base))
    took = time.monotonic() - start
    out = capsys.readouterr().out
    assert status == 0
    assert len(calls.read_text().splitlines()) == 1  # one step for the whole job
    printed = [line.split()[3] for line in out.splitlines() if line.startswith("== logs of ")]
    assert printed == names  # every node, in node order
    assert took < 10, took  # the bound (one srun, not 1,000 of up to 120 s each)
    assert not list(state.dir.glob(".logs-read-*"))  # the per-task files are gone
