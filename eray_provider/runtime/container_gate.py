"""Before a cluster's first step in its container: on every node, the paths the container
will come from are the user's or root's, and nobody else could have put or changed anything
on them.

Why: pyxis starts an existing named container as it finds it, without importing the image
again, and enroot keeps containers under a path of the site's choosing (``ENROOT_DATA_PATH``;
sites often pick ``/tmp/enroot-data/user-$(id -u)``) that it creates with ``mkdir -p`` and
never checks the owner of. Our container's name is known in advance (``eray.<cluster>.<job>``),
so a co-tenant who makes that path first (or the dir above it) plants a root file system
of their own, and every node of the cluster would run it as the user, with the cluster's
state dir and token mounted. A leftover of the user's own (an earlier cluster of the same
name and job, left by a teardown that could not reach the node) is no better: pyxis would
run its old image. So the gate, one plain step (not in any container) on every node:

- asks enroot itself (the site's ``enroot.conf`` and its drop-ins, evaluated by enroot's
  own code, with no ``ENROOT_*`` variable of ours: pyxis passes none either) where it keeps
  containers (``ENROOT_DATA_PATH``) and their mounts (``ENROOT_RUNTIME_PATH``);
- walks each of those paths, the named container's, and the image's when it is a file,
  component by component (as written and resolved): each must belong to root or the user,
  and be writable by no one else unless sticky (``/tmp``: others cannot rename or remove
  what is not theirs);
- removes a leftover named container (now known to be the user's), so the first step makes
  it afresh from the image.

Any other answer refuses the cluster, naming the node, the path and its owner. The gate
needs ``bash``, ``stat`` and ``enroot`` on the node, as pyxis does; no Python.
"""

from __future__ import annotations

import pwd
from collections.abc import Sequence

from ..errors import ClusterError
from ..plan.names import step_name
from ..slurm.hostlist import compress
from ..slurm.srun import run_step, srun_argv

#: Seconds the gate (one srun over the nodes) may take.
GATE_TIMEOUT = 120.0
#: Each node's answer starts with this word.
ANSWER = "ERAY_CONTAINER_GATE"

#: The gate on one node: ``bash -c GATE gate NAME IMAGE`` (IMAGE: a file's path, or empty).
GATE = r"""
set -u
name="pyxis_$1" image="$2" me=$(id -u) node="${SLURMD_NODENAME:-$(hostname)}"
say() { printf '%s %s %s\n' "ERAY_CONTAINER_GATE" "$node" "$*"; }
# the first component of $1 (as written: symbolic links are components too) that belongs to
# another user, or that another user may write in and is not sticky
open_to_others() {
  local p="" rest="${1#/}" uid mode
  while [ -n "$rest" ]; do
    p="$p/${rest%%/*}"
    case $rest in */*) rest="${rest#*/}" ;; *) rest="" ;; esac
    [ -e "$p" ] || [ -L "$p" ] || return 0
    read -r uid mode <<<"$(stat -c '%u %a' -- "$p")"
    if [ "$uid" != 0 ] && [ "$uid" != "$me" ]; then echo "$p $uid $mode"; return; fi
    if [ ! -L "$p" ] && (( 8#$mode & 8#022 )) && ! (( 8#$mode & 8#1000 )); then
      echo "$p $uid $mode"; return
    fi
  done
}
for var in $(compgen -e ENROOT_); do unset "$var"; done
enroot=$(command -v enroot) || { say missing enroot is not on the PATH of a step; exit 0; }
trace=$(bash -x "$enroot" list 2>&1 >/dev/null) || { say failed "${trace: -300}"; exit 0; }
path_of() {
  local v
  v=$(sed -n "s/^+* *export '\{0,1\}$1=//p" <<<"$trace" | tail -n 1)
  echo "${v%\'}"
}
data=$(path_of ENROOT_DATA_PATH) runtime=$(path_of ENROOT_RUNTIME_PATH)
[ -n "$data" ] && [ -n "$runtime" ] || { say failed enroot named no ENROOT_DATA_PATH; exit 0; }
paths=("$data" "$runtime" "$data/$name")
[ -n "$image" ] && paths+=("$image")
for path in "${paths[@]}"; do
  for each in "$path" "$(realpath -m -- "$path")"; do
    bad=$(open_to_others "$each")
    [ -z "$bad" ] || { say open "$path" $bad; exit 0; }
  done
done
if [ -e "$data/$name" ] || [ -L "$data/$name" ]; then
  out=$(enroot remove -f "$name" 2>&1) || { say failed "cannot remove a leftover $data/$name: $out"; exit 0; }
  say ok removed "$data/$name"
else
  say ok
fi
"""


class ContainerGateError(ClusterError):
    """A node's container paths are open to other users, or could not be checked."""


def _owner(uid: str) -> str:
    try:
        return f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
    except (KeyError, ValueError):
        return f"uid {uid}"


def judge(stdout: str, nodes: Sequence[str]) -> list[str]:
    """Each node's answer to the gate, read: the nodes that removed a leftover container
    (``removed`` lines for the log). ``ContainerGateError`` naming every node that did not
    answer ``ok``, with what it found."""
    answers: dict[str, str] = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == ANSWER:
            node, _, verdict = rest.partition(" ")
            answers[node] = verdict
    problems: list[str] = []
    removed: list[str] = []
    for node in nodes:
        kind, _, detail = answers.get(node, "").partition(" ")
        if kind == "ok":
            if detail.startswith("removed "):
                removed.append(f"{node}: {detail}")
        elif kind == "open":
            path, component, uid, mode = detail.rsplit(" ", 3)
            problems.append(
                f"on {node}, {component} (on the way to {path}) belongs to {_owner(uid)} with mode {mode}: "
                "whoever owns it, or may write in it, can put a root file system of their own where "
                "pyxis looks for the cluster's container, and the nodes would run it as you with the "
                "cluster's token mounted"
            )
        elif kind in ("missing", "failed"):
            problems.append(f"on {node}, the check could not run: {detail}")
        else:
            problems.append(f"{node} did not answer the check")
    if problems:
        raise ContainerGateError(
            "provider.container: the cluster will not start: " + "; ".join(problems) + " (the site's "
            "enroot.conf sets where enroot keeps containers: ENROOT_DATA_PATH, ENROOT_RUNTIME_PATH; a "
            "path under a shared dir must be made by its user or root, e.g. /run/enroot/user-$(id -u))"
        )
    return removed


def image_file(image: str) -> str:
    """The image's path when pyxis will read it from a file (a path), else ''."""
    return image if image.startswith(("/", "./", "../")) else ""


def gate_containers(cluster: str, job_id: str, nodes: Sequence[str], name: str, image: str) -> list[str]:
    """Run the gate on ``nodes`` of ``job_id`` for the container ``name`` of ``image``
    (``judge`` says what is returned and raised)."""
    step = step_name(cluster, "container-gate")
    argv = srun_argv(job_id, nodes, ["bash", "-c", GATE, "gate", name, image_file(image)], name=step)
    what = f"the container check (step {step} of job {job_id} on {compress(nodes)})"
    proc = run_step(argv, what, GATE_TIMEOUT)
    if proc.returncode != 0:
        raise ContainerGateError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return judge(proc.stdout, nodes)
