"""Time from demand to a worker node alive in an elastic cluster, side by side:

(a) eray-provider's ``SlurmJobProvider``: a driver asks for a placement group that needs
    one more node than the head; the autoscaler submits a worker job, the job starts,
    its node joins and the group is placed (measured inside the driver, from the
    request to placed);
(b) by hand, the same node without the autoscaler: ``sbatch`` of a job whose step runs
    ``ray start --address=<head> --block``, timed from sbatch until the head's GCS lists
    the node alive (a poll, not a sleep).

Both on the SLURM test bed, against the same head, one after the other, ``--rounds``
times each. Run as root with the test bed up: ``python bench/elastic_bench.py``.
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
from time_to_cluster import REPO, count_alive, env_with_testbed

NAME = "elbench"


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
    t0 = time.monotonic()
    job = subprocess.run(
        ["sbatch", "--parsable", "-N1", "-c2", "--mem=1200M", "-J", "byhand", "-o", "/dev/null"],
        input=script,
        env=e,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        while count_alive(address, e) <= before:
            if time.monotonic() - t0 > 300:
                raise SystemExit("the hand-started node did not join within 300 s")
            time.sleep(0.2)
        return time.monotonic() - t0
    finally:
        subprocess.run(["scancel", job], env=env)
        deadline = time.monotonic() + 120  # the next round starts from the same cluster
        while count_alive(address, e) > before and time.monotonic() < deadline:
            time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    env = env_with_testbed()
    env.pop("SLURM_JOB_ID", None)
    config = yaml.safe_load((REPO / "cluster_yamls" / "slurm-autoscale.yaml").read_text())
    config.update(cluster_name=NAME, idle_timeout_minutes=0.25)
    types = config["available_node_types"]
    types["head"]["node_config"]["sbatch"] = {"cpus_per_node": 2, "mem": "1500M"}
    types["cpu"]["node_config"]["sbatch"] = {"cpus_per_node": 2, "mem": "1200M"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "elbench.yaml"
        path.write_text(yaml.safe_dump(config))
        subprocess.run(["ray", "up", "-y", str(path)], env=env, check=True, capture_output=True)
        try:
            state = next(p for p in (Path.home() / ".eray-provider").glob(f"{NAME}-*") if p.is_dir())
            a = [elastic_round(path, env) for _ in range(args.rounds)]
            b = [by_hand_round(state, env) for _ in range(args.rounds)]
        finally:
            subprocess.run(["ray", "down", "-y", str(path)], env=env, capture_output=True)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"(a) autoscaler + sbatch (eray-provider): {ma:6.1f} s demand -> node placed   {a}")
    print(f"(b) sbatch + ray start by hand:           {mb:6.1f} s sbatch -> node alive  {b}")
    print(f"ratio (a)/(b): {ma / mb:.2f}")


if __name__ == "__main__":
    main()
