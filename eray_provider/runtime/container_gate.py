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
run its old image. So the gate, one plain step (not in any container) on every node, in
the environment the container's steps get:

- asks enroot itself (``enroot info``: the site's ``enroot.conf`` and its drop-ins,
  evaluated by enroot's own code) for its paths, without the ``ENROOT_*`` variables pyxis
  does not pass to it (the data, runtime, cache, temp, sysconf and library paths) and with
  those it does (``ENROOT_CONFIG_PATH``);
- makes enroot's config dir where it is missing (enroot never does, and runs the hooks it
  finds there as the user, before the container's root is set), private;
- walks each path pyxis' enroot reads a container from or runs code of: the data path and
  the named container's path under either of pyxis' names, the config dir and its
  ``hooks.d``, ``mounts.d``, ``environ.d``, the runtime, temp, sysconf and library paths,
  and the image file (which must exist) or, for a registry image, the cache of its layers.
  Every component, and every link's target hop by hop, must belong to root or the user and
  be writable by no one else unless sticky (``/tmp``: others cannot rename or remove what
  is not theirs);
- removes a leftover named container (now known to be the user's), so the first step makes
  it afresh from the image.

Any other answer refuses the cluster, naming the node, the path and its owner. Not covered:
an ``enroot`` on the step's PATH other than the one slurmstepd runs for pyxis (a site with
two installs). The gate needs ``bash``, coreutils and ``enroot`` on the node, as pyxis
does; no Python.
"""

from __future__ import annotations

import pwd
import shlex
from collections.abc import Mapping, Sequence

from ..errors import ClusterError
from ..plan.names import step_name
from ..slurm.hostlist import compress
from ..slurm.srun import run_step, srun_argv

#: Seconds the gate (one srun over the nodes) may take.
GATE_TIMEOUT = 120.0
#: Each node's answer starts with this word.
ANSWER = "eray-container-gate"

#: The gate on one node: ``bash -c GATE gate NAME IMAGE`` (IMAGE: a file's path, or empty).
GATE = r"""
set -u
name="$1" image="$2" me=$(id -u) node="${SLURMD_NODENAME:-$(hostname)}"
say() { local text="$*"; printf '%s %s %s\n' "eray-container-gate" "$node" "${text//$'\n'/ }"; }
# every path the walk reaches: "path uid mode" of the first that belongs to another user, or
# that another user may write in and is not sticky; a link is walked as a component and then
# its target (as `namei` does), so no directory on the way is left out
open_to_others() {
  local p="" rest="${1#/}" depth="${2:-0}" uid mode target bad
  (( depth < 40 )) || { echo "$1 too-many-links -"; return; }
  while [ -n "$rest" ]; do
    local part="${rest%%/*}"
    case $rest in */*) rest="${rest#*/}" ;; *) rest="" ;; esac
    [ -z "$part" ] || [ "$part" = . ] && continue
    if [ "$part" = .. ]; then p="${p%/*}"; continue; fi
    p="$p/$part"
    [ -e "$p" ] || [ -L "$p" ] || return 0
    read -r uid mode <<<"$(stat -c '%u %a' -- "$p")"
    if [ "$uid" != 0 ] && [ "$uid" != "$me" ]; then echo "$p $uid $mode"; return; fi
    if [ -L "$p" ]; then
      target=$(readlink -- "$p")
      case $target in /*) ;; *) target="${p%/*}/$target" ;; esac
      bad=$(open_to_others "$target" $((depth + 1)))
      [ -z "$bad" ] || { echo "$bad"; return; }
      p=$(realpath -m -- "$p")
      [ "$p" = / ] && p=""
    elif (( 8#$mode & 8#022 )) && ! (( 8#$mode & 8#1000 )); then
      echo "$p $uid $mode"; return
    fi
  done
}
# enroot as pyxis runs it: without the variables pyxis keeps from it (the site's enroot.conf
# decides those), with the rest of the step's environment (ENROOT_CONFIG_PATH, HOME...)
unset LD_PRELOAD LD_LIBRARY_PATH ENROOT_LIBRARY_PATH ENROOT_SYSCONF_PATH ENROOT_RUNTIME_PATH \
  ENROOT_CACHE_PATH ENROOT_DATA_PATH ENROOT_TEMP_PATH
command -v enroot >/dev/null || { say missing enroot is not on the PATH of a step; exit 0; }
info=$(enroot info 2>&1) || { say failed "enroot info: ${info: -300}"; exit 0; }
value() { sed -n "s/^  $1=//p" <<<"$info" | tail -n 1; }
data=$(value ENROOT_DATA_PATH) config=$(value ENROOT_CONFIG_PATH)
[ -n "$data" ] && [ -n "$config" ] || { say failed enroot info named no ENROOT_DATA_PATH; exit 0; }
# enroot makes its data, cache and runtime dirs at each call (umask 077), never its config
# dir, which it reads hooks and mounts from: made here, so nobody else can make it later
(umask 077 && mkdir -p -- "$config") || { say failed "cannot make $config"; exit 0; }
named=("$data/pyxis_$name" "$data/pyxis_${SLURM_JOB_ID:-0}_$name")  # pyxis' global and job scope
paths=("$data" "$config" "$config/hooks.d" "$config/mounts.d" "$config/environ.d" "${named[@]}")
for var in ENROOT_RUNTIME_PATH ENROOT_TEMP_PATH ENROOT_SYSCONF_PATH ENROOT_LIBRARY_PATH; do
  paths+=("$(value "$var")")
done
if [ -n "$image" ]; then
  [ -f "$image" ] || { say failed "the image $image is not a file on this node"; exit 0; }
  paths+=("$(realpath -- "$image")")
else
  paths+=("$(value ENROOT_CACHE_PATH)")  # the layers of a registry image, reused unchecked
fi
for path in "${paths[@]}"; do
  [ -n "$path" ] || continue
  bad=$(open_to_others "$path")
  [ -z "$bad" ] || { say open "$path" "$bad"; exit 0; }
done
removed=()
for leftover in "${named[@]}"; do
  [ -e "$leftover" ] || [ -L "$leftover" ] || continue
  out=$(enroot remove -f "${leftover##*/}" 2>&1) || { say failed "cannot remove $leftover: $out"; exit 0; }
  removed+=("$leftover")
done
if [ ${#removed[@]} -gt 0 ]; then say ok removed "${removed[@]}"; else say ok; fi
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
            # two answers of one node that differ: neither is taken
            answers[node] = verdict if answers.get(node, verdict) == verdict else "twice"
    problems: list[str] = []
    removed: list[str] = []
    for node in nodes:
        kind, _, detail = answers.get(node, "").partition(" ")
        if kind == "ok":
            if detail.startswith("removed "):
                removed.append(f"{node}: {detail}")
        elif kind == "open" and len(detail.rsplit(" ", 3)) == 4:
            path, component, uid, mode = detail.rsplit(" ", 3)
            problems.append(
                f"on {node}, {component} (on the way to {path}) belongs to {_owner(uid)} with mode {mode}: "
                "whoever owns it, or may write in it, can put a root file system of their own where "
                "pyxis looks for the cluster's container, and the nodes would run it as you with the "
                "cluster's token mounted"
            )
        elif kind in ("missing", "failed"):
            problems.append(f"on {node}, the check could not run: {detail}")
        elif kind:
            problems.append(f"{node} answered the check with {f'{kind} {detail}'.strip()!r}")
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
    """The image's path when pyxis reads it from a file (it starts with ``.`` or ``/``, as
    pyxis tells one), else '' (a registry reference)."""
    return image if image.startswith((".", "/")) else ""


def gate_containers(
    cluster: str, job_id: str, nodes: Sequence[str], name: str, image: str, env: Mapping[str, str]
) -> list[str]:
    """Run the gate on ``nodes`` of ``job_id`` for the container ``name`` of ``image``, in
    the environment the container's steps get (``env``: pyxis hands it to enroot, whose
    defaults may read it: HOME, XDG_*, ENROOT_CONFIG_PATH); ``judge`` says what is returned
    and raised."""
    step = step_name(cluster, "container-gate")
    argv = srun_argv(job_id, nodes, ["bash", "-c", GATE, "gate", name, image_file(image)], name=step)
    what = f"the container check (step {step} of job {job_id} on {compress(nodes)})"
    proc = run_step(argv, what, GATE_TIMEOUT, env)
    if proc.returncode != 0:
        raise ContainerGateError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return judge(proc.stdout, nodes)


#: A worker job's verdict on its gate's answers, in its script (the host has no Python to
#: count on): exactly one answer per node, each ``ok``, or the job fails before any
#: container starts, the answers in its log.
_JOB_VERDICT = r"""
rc=$?
want=${SLURM_JOB_NUM_NODES:-1}
bad=$(grep -v -E '^eray-container-gate [^ ]+ ok( removed .*)?$' <<<"$answers")
lines=$(grep -c . <<<"$answers")
nodes=$(awk 'NF {print $2}' <<<"$answers" | sort -u | grep -c .)
if [ "$rc" != 0 ] || [ -n "$bad" ] || [ "$lines" != "$want" ] || [ "$nodes" != "$want" ]; then
  printf 'eray-provider: the container check refused the nodes of job %s (exit %s, %s of %s %s):\n%s\n' \
    "$SLURM_JOB_ID" "$rc" "$nodes" "$want" "nodes answered" "$answers" >&2
  exit 1
fi
"""


def job_gate(cluster: str, image: str) -> str:
    """The lines of an elastic worker job's script that run the gate on every node of the
    job, before its one step enters a container: that step's container (pyxis' name for a
    container of its own, ``<job>.<step>``: the job's second step) is checked as a
    cluster's named one is, under the job's environment (the container's steps'). A node
    that does not answer ``ok`` fails the job, its answers in the job's log."""
    step = shlex.quote(step_name(cluster, "container-gate"))
    return (
        f"gate={shlex.quote(GATE)}\n"
        "answers=$(srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=0 --quiet "
        f'--job-name={step} bash -c "$gate" gate "$SLURM_JOB_ID.1" {shlex.quote(image_file(image))})'
        + _JOB_VERDICT
    )
