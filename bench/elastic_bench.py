"""Time from demand to a worker node alive in an elastic cluster, side by side:

(a) eray-provider's ``SlurmJobProvider``: a driver asks for a placement group that needs
    one more node than the head; the autoscaler submits a worker job, the job starts,
    its node joins and the group is placed (measured inside the driver, from the
    request to placed);
(b) by hand, the same node without the autoscaler: ``sbatch`` of a job whose step runs
    ``ray start --address=<head> --block``, timed from sbatch until the head's GCS lists
    the node alive (one in-process GCS poller, the same as ``time_to_cluster``'s).

Both on the SLURM test bed, against the same head, ``--rounds`` times each, interleaved;
printed as medians (with min and max) and their ratio. ``--autoscaler-interval`` sets
``provider.autoscaler_interval_s`` (Ray's own default is 5 s, ours 1 s). Run as root with
the test bed up: ``python bench/elastic_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from time_to_cluster import REPO, alive_at, busy_seconds, poller, testbed_env

from eray_provider.plan.modules import GCS_PROBE

NAME = "elbench"


def count_alive(address: str, env: dict[str, str]) -> int:
    """Alive nodes the GCS at ``address`` lists (0 when it does not answer)."""
    proc = subprocess.run(
        [sys.executable, "-m", GCS_PROBE, address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return len(proc.stdout.splitlines()) if proc.returncode == 0 else 0


def squeue_ours(env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if f"eray.{NAME}." in line and ".head" not in line]


def elastic_round(config: Path, env: dict[str, str]) -> float:
    out = subprocess.run(
        ["ray", "submit", str(config), "tests/drivers/elastic_demand.py", "--", "2"],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    seconds = float(re.search(r"READY after ([\d.]+) s", out).group(1))
    deadline = time.monotonic() + 300  # let the idle worker's job be cancelled
    while squeue_ours(env) and time.monotonic() < deadline:
        time.sleep(1)
    return seconds


def by_hand_round(state: Path, env: dict[str, str]) -> float:
    head_ip = next(state.glob("nodes/node*.ip")).read_text().strip()
    gcs = json.loads((state / "ports.json").read_text())["gcs"]
    address = f"{head_ip}:{gcs}"
    e = dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(state / "auth_token"))
    before = count_alive(address, e)
    script = (
        "#!/bin/bash\nexec srun --ntasks-per-node=1 bash -c 'T=$(mktemp -d); "
        f"exec {Path(sys.executable).parent}/ray start --block --address={address} --num-cpus=2 "
        "--disable-usage-stats --temp-dir=$T'\n"
    )
    host, _, port = address.rpartition(":")
    t0 = time.time()
    poll = poller(e, host, int(port), before + 1)  # one in-process poller, as for (a)
    job = subprocess.run(
        ["sbatch", "--parsable", "-N1", "-c2", "--mem=1200M", "-J", "byhand", "-o", "/dev/null"],
        input=script,
        env=e,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        return alive_at(poll, t0, busy_seconds())
    finally:
        poll.kill()
        subprocess.run(["scancel", job], env=env)
        deadline = time.monotonic() + 120  # the next round starts from the same cluster
        while count_alive(address, e) > before and time.monotonic() < deadline:
            time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--autoscaler-interval", type=int, default=None, help="provider.autoscaler_interval_s (default: ours)"
    )
    args = ap.parse_args()
    env = testbed_env(1)
    env.pop("SLURM_JOB_ID", None)
    config = yaml.safe_load((REPO / "cluster_yamls" / "slurm-autoscale.yaml").read_text())
    config.update(cluster_name=NAME, idle_timeout_minutes=0.25)
    if args.autoscaler_interval is not None:
        config["provider"]["autoscaler_interval_s"] = args.autoscaler_interval
    types = config["available_node_types"]
    types["head"]["node_config"]["sbatch"] = {"cpus_per_node": 2, "mem": "1500M"}
    types["cpu"]["node_config"]["sbatch"] = {"cpus_per_node": 2, "mem": "1200M"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "elbench.yaml"
        path.write_text(yaml.safe_dump(config))
        subprocess.run(["ray", "up", "-y", str(path)], env=env, check=True, capture_output=True)
        try:
            # the running cluster's state dir: an earlier run's `ray down` leaves its logs in one
            dirs = (Path.home() / ".eray-provider").glob(f"{NAME}-*")
            state = next(p for p in dirs if (p / "state.json").exists())
            a, b = [], []
            for _ in range(args.rounds):  # interleaved, so that drift hits both arms alike
                a.append(elastic_round(path, env))
                b.append(by_hand_round(state, env))
        finally:
            subprocess.run(["ray", "down", "-y", str(path)], env=env, capture_output=True)
    ma, mb = statistics.median(a), statistics.median(b)
    runs = lambda xs: f"min {min(xs):.1f} max {max(xs):.1f} of {len(xs)}"  # noqa: E731
    print(f"(a) autoscaler + sbatch (eray-provider): median {ma:6.1f} s demand -> node placed ({runs(a)})")
    print(f"(b) sbatch + ray start by hand:           median {mb:6.1f} s sbatch -> node alive ({runs(b)})")
    print(f"ratio (a)/(b): {ma / mb:.2f}")


if __name__ == "__main__":
    main()
