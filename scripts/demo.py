#!/usr/bin/env python3
"""`make demo`: the whole user flow on the SLURM test bed, each step printed.

allocation -> ray up -> ray exec 'ray status' -> ray submit (one task per node) ->
ray down -> release of the allocation. Brings the test bed up when it is not running
(and takes it down again at the end in that case). Runs as root.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "scripts" / "slurm-testbed"
CONFIG = REPO / "cluster_yamls" / "slurm-cluster.yaml"


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(argv: list[str], env: dict[str, str], quiet: bool = False, timeout: float = 600) -> str:
    print("$ " + " ".join(shlex.quote(a) for a in argv), flush=True)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        print(out)
        raise SystemExit(f"demo: {argv[0]} {argv[1] if len(argv) > 1 else ''} failed ({proc.returncode})")
    if not quiet:
        # Ray's launcher logs every line with a timestamp: show the user-facing lines
        shown = [line for line in out.splitlines() if not re.match(r"^\d{4}-\d\d-\d\d ", line)]
        print("\n".join(shown).strip())
    return out


def bed_running() -> bool:
    return subprocess.run([str(TESTBED), "status"], capture_output=True, timeout=60).returncode == 0


def check_bed_sees_checkout() -> None:
    """A running test bed whose nodes cannot see this checkout (it was brought up for
    another one, and each node has a private /tmp) stops the demo at once, in one line,
    before anything is built."""
    if not bed_running():
        return
    seen = subprocess.run(
        [str(TESTBED), "exec", "node1", "test", "-d", str(REPO)], capture_output=True, timeout=60
    )
    if seen.returncode != 0:
        raise SystemExit(
            f"demo: the running test bed's nodes do not see {REPO} (each node has a private /tmp): "
            f"run `scripts/slurm-testbed down`, then `make demo` again"
        )


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        check_bed_sees_checkout()
        return 0
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    started = not bed_running()
    t0 = time.monotonic()
    if started:
        step("the SLURM test bed: 3 nodes, each in its own network namespace")
        # the checkout (its .venv) must be seen by the nodes, as on a shared file system,
        # also where it lies under /tmp, which each node has a private one of
        run([str(TESTBED), "up", "--share", str(REPO)], env)
    check_bed_sees_checkout()
    env.update(
        line.split(" ", 1)[1].split("=", 1)
        for line in subprocess.run([str(TESTBED), "env"], capture_output=True, text=True).stdout.split("\n")
        if line.startswith("export ")
    )
    job = None
    try:
        step("1. an allocation of 3 nodes (2 CPUs, 2 GPUs, 3000 MB each)")
        salloc = ["salloc", "--no-shell", "-N3", "-c2", "--gpus-per-node=2", "--mem=3000", "-J", "demo"]
        out = run(salloc, env)
        job = re.search(r"Granted job allocation (\d+)", out).group(1)
        env["SLURM_JOB_ID"] = job  # as inside `salloc` or an sbatch script
        run([sys.executable, "-m", "eray_provider.cli", "inspect"], env)

        step("2. ray up: head on the first node, workers started by the provider over srun")
        run(["ray", "up", "-y", str(CONFIG)], env, quiet=True)
        code = (
            "import json,ray; ray.init(); print('ALIVE', json.dumps(sorted("
            "n['Labels'].get('slurm-node','?') for n in ray.nodes() if n['Alive'])))"
        )
        deadline = time.monotonic() + 180
        while True:
            out = subprocess.run(
                ["ray", "exec", str(CONFIG), f"python -c {shlex.quote(code)}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            alive = next((json.loads(line[6:]) for line in out.splitlines() if line.startswith("ALIVE ")), [])
            if len(alive) == 3 or time.monotonic() > deadline:
                break
            time.sleep(2)
        print(f"nodes alive: {alive} ({time.monotonic() - t0:.1f} s since the start of the demo)")
        if len(alive) != 3:
            raise SystemExit("demo: the cluster did not reach 3 nodes within 180 s")

        step("3. ray exec 'ray status'")
        run(["ray", "exec", str(CONFIG), "ray status"], env)

        step("4. ray submit: one task on every node, printing its SLURM name and resources")
        run(["ray", "submit", str(CONFIG), "examples/per_node.py"], env)

        for example in ("examples/jax_psum.py",):
            if (REPO / example).exists():
                step(f"5. ray submit {example}: JAX collectives across every node")
                run(["ray", "submit", str(CONFIG), example], env)

        step("6. ray down: this cluster's steps cancelled, temp dirs removed")
        run(["ray", "down", "-y", str(CONFIG)], env, quiet=True)
        print("cluster down")
    finally:
        if job:
            step("7. release the allocation")
            run(["scancel", job], env)
        if started:
            run([str(TESTBED), "down"], env)
    print(f"\ndemo finished in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
