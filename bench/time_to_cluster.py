"""Wall time from nothing to every node of a 3-node allocation alive in Ray, side by side:

(a) ``ray up`` with eray-provider (readiness checked, workers launched in one srun);
(b) the sbatch template from Ray's SLURM docs: ``srun ... ray start --head --block &``,
    ``sleep 10``, then one ``srun ... ray start --address ... --block &`` per worker with
    ``sleep 5`` after each (the template's values; ``--head-sleep``/``--worker-sleep``).

Both run in the same allocation size on the SLURM test bed, one after the other, and
"alive" is measured the same way for both: a GCS poll until it lists every node.
Run as root with the test bed up: ``python bench/time_to_cluster.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
NODES = 3


def env_with_testbed() -> dict[str, str]:
    out = subprocess.run(
        [str(REPO / "scripts" / "slurm-testbed"), "env"], capture_output=True, text=True, check=True
    ).stdout
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return env


def salloc(env: dict[str, str]) -> str:
    out = subprocess.run(
        ["salloc", "--no-shell", f"-N{NODES}", "-c2", "--mem=3000", "-J", "bench"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout).group(1)


def count_alive(address: str, env: dict[str, str]) -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "eray_provider.gcs_probe", address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return len(proc.stdout.split()) if proc.returncode == 0 else 0


def wait_alive(address: str, env: dict[str, str], t0: float, timeout: float = 300) -> float:
    while time.monotonic() - t0 < timeout:
        if count_alive(address, env) >= NODES:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit(f"not all {NODES} nodes alive at {address} after {timeout} s")


def with_provider(env: dict[str, str], workdir: Path) -> float:
    job = salloc(env)
    config = yaml.safe_load((REPO / "cluster_yamls" / "slurm-cluster.yaml").read_text())
    config["cluster_name"] = "bench"
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    e = dict(env, SLURM_JOB_ID=job)
    try:
        t0 = time.monotonic()
        subprocess.run(["ray", "up", "-y", str(path)], env=e, check=True, capture_output=True)
        state = Path.home() / ".eray-provider" / f"bench-{job}"
        head_ip = next(state.glob("nodes/node1.*.ip")).read_text().strip()
        gcs = yaml.safe_load((state / "ports.json").read_text())["gcs"]
        e.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(state / "auth_token"))
        return wait_alive(f"{head_ip}:{gcs}", e, t0)
    finally:
        subprocess.run(["ray", "down", "-y", str(path)], env=dict(env, SLURM_JOB_ID=job), capture_output=True)
        subprocess.run(["scancel", job], env=env)


def with_docs_template(env: dict[str, str], head_sleep: float, worker_sleep: float) -> float:
    job = salloc(env)
    port = 36379 + int(job) % 1000
    e = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    e["RAY_AUTH_MODE"] = "disabled"
    procs = []

    def start(node: str, *args: str) -> None:
        procs.append(
            subprocess.Popen(
                [
                    "srun",
                    f"--jobid={job}",
                    "--overlap",
                    "-N1",
                    "-n1",
                    "-w",
                    node,
                    "ray",
                    "start",
                    "--block",
                    "--num-cpus=2",
                    "--disable-usage-stats",
                    *args,
                ],
                env=e,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    try:
        t0 = time.monotonic()
        head_ip = "10.77.0.11"
        start(
            "node1", "--head", f"--node-ip-address={head_ip}", f"--port={port}", "--include-dashboard=false"
        )
        time.sleep(head_sleep)
        for k in range(2, NODES + 1):
            start(f"node{k}", f"--address={head_ip}:{port}")
            time.sleep(worker_sleep)
        return wait_alive(f"{head_ip}:{port}", e, t0)
    finally:
        subprocess.run(["scancel", job], env=env)
        for p in procs:
            p.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-sleep", type=float, default=10.0)
    ap.add_argument("--worker-sleep", type=float, default=5.0)
    args = ap.parse_args()
    env = env_with_testbed()
    with tempfile.TemporaryDirectory() as tmp:
        a = with_provider(env, Path(tmp))
    b = with_docs_template(env, args.head_sleep, args.worker_sleep)
    print(f"(a) ray up with eray-provider: {a:6.1f} s to {NODES} nodes alive")
    print(
        f"(b) Ray docs sbatch template:  {b:6.1f} s to {NODES} nodes alive "
        f"(sleep {args.head_sleep:g} after the head, {args.worker_sleep:g} after each worker)"
    )
    print(f"ratio (a)/(b): {a / b:.2f}")


if __name__ == "__main__":
    main()
