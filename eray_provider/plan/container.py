"""``provider.container``: every Ray node of a cluster in the user's image, and how a step
reaches it. Pure: the config, typed, and the arguments a step's ``srun`` gets.

The first step of a cluster on a node (the port probe) makes the node's container from the
image under one name per cluster and job (``container_name``): pyxis unpacks the image once
into a root file system it keeps under that name. Every later step there (the node's
long-lived ``node_run``, which starts Ray; ``ray exec``/``attach``/``submit``, setup
commands) starts in that same root file system with the same mounts
(``--container-name=NAME:no_exec``: a new instance, never a join of a running one, which
needs the namespaces of one process of it and takes no time to start). What the steps must
share is mounted at the same paths in every instance: the nodes' temp base (each instance
would have a tmpfs ``/tmp`` of its own under enroot's stock mounts; the port probe's claims,
Ray's temp dirs and sockets, and the teardown must be one), the cluster's state dir
(markers, the token, its Ray's HOME), and the eray-provider package the nodes import (so the
image needs Ray and its dependencies, not eray-provider). ``/dev/shm`` is the node's in
every instance (enroot's stock mounts), so drivers reach the object store.

Runners: ``pyxis`` (``srun --container-*``, NVIDIA's SPANK plugin over enroot). The keys are
the runner's common ground (image, mounts, workdir, env, writable, root) so that an
Apptainer runner (``apptainer exec`` inside the step) can be added without new keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError
from ..slurm.host_commands import RELAY_ENV
from .names import container_name

RUNNERS = ("pyxis",)


class ContainerConfigError(ConfigError):
    """``provider.container`` is malformed."""


@dataclass(frozen=True)
class ContainerConfig:
    """``provider.container``, checked."""

    #: what pyxis imports: a squashfs file (``/path/image.sqsh``), or a registry reference
    #: (``nvcr.io#nvidia/pytorch:24.05-py3``, ``docker://...``)
    image: str
    #: ``pyxis`` (the only runner so far)
    runner: str = "pyxis"
    #: more mounts, each ``SRC[:DST[:FLAGS]]`` as pyxis' ``--container-mounts`` takes them
    mounts: tuple[str, ...] = ()
    #: the working dir inside (default: the image's)
    workdir: str | None = None
    #: variables set inside, over the image's
    env: Mapping[str, str] = field(default_factory=dict)
    #: a writable root file system (default: read-only, as pyxis' ``--container-readonly``)
    writable: bool = False
    #: run as root inside (pyxis' ``--container-remap-root``); default: the user's own uid
    root: bool = False

    @classmethod
    def from_value(cls, value: Any, where: str = "provider.container") -> ContainerConfig | None:
        """Parse the YAML's value (None: no container). Names the key and quotes the value
        of anything wrong; an unknown key is refused with the valid ones listed."""
        if value is None:
            return None
        if isinstance(value, str):
            value = {"image": value}
        if not isinstance(value, Mapping):
            raise ContainerConfigError(f"{where} must be a mapping (image: ...) or an image, got {value!r}")
        known = {f.name for f in fields(cls)}
        for key in value:
            if key not in known:
                raise ContainerConfigError(
                    f"{where}.{key} is not a container setting; valid keys: " + ", ".join(sorted(known))
                )
        image = value.get("image")
        if not isinstance(image, str) or not image.strip() or "," in image:
            raise ContainerConfigError(f"{where}.image must be an image (a path, a reference), got {image!r}")
        runner = value.get("runner", "pyxis")
        if runner not in RUNNERS:
            raise ContainerConfigError(f"{where}.runner must be one of {list(RUNNERS)}, got {runner!r}")
        mounts = value.get("mounts") or []
        if not isinstance(mounts, list) or not all(isinstance(m, str) and m and "," not in m for m in mounts):
            raise ContainerConfigError(f"{where}.mounts must be a list of SRC[:DST[:FLAGS]], got {mounts!r}")
        workdir = value.get("workdir")
        if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
            raise ContainerConfigError(f"{where}.workdir must be an absolute path, got {workdir!r}")
        env = value.get("env") or {}
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and k.isidentifier() for k in env):
            raise ContainerConfigError(f"{where}.env must map variable names to values, got {env!r}")
        flags = {}
        for key in ("writable", "root"):
            flag = value.get(key, False)
            if not isinstance(flag, bool):
                raise ContainerConfigError(f"{where}.{key} must be true or false, got {flag!r}")
            flags[key] = flag
        return cls(
            image=image.strip(),
            runner=runner,
            mounts=tuple(mounts),
            workdir=workdir,
            env={k: str(v) for k, v in env.items()},
            **flags,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["mounts"], out["env"] = list(self.mounts), dict(self.env)
        return out


def start_args(config: ContainerConfig, name: str | None, same_path: Sequence[str]) -> list[str]:
    """The ``srun`` arguments of a step of the cluster on a node: an instance of its named
    container (made from the image by the first), or with ``name`` None a container of the
    step's own, which pyxis removes when the step ends; with ``same_path`` (the state dir,
    the package) mounted where they are outside (an entry with a ``:`` is taken as a mount
    as it is)."""
    mounts = [*(path if ":" in path else f"{path}:{path}" for path in same_path), *config.mounts]
    args = [f"--container-image={config.image}"]
    if name is not None:
        args.append(f"--container-name={name}:no_exec")
    if mounts:
        args.append("--container-mounts=" + ",".join(mounts))
    if config.workdir:
        args.append(f"--container-workdir={config.workdir}")
    args.append("--container-writable" if config.writable else "--container-readonly")
    args.append("--container-remap-root" if config.root else "--no-container-remap-root")
    return args


@dataclass(frozen=True)
class ContainerPlan:
    """How a cluster's steps reach its container on each node of its job: made once when
    the cluster is planned and kept in its state dir (``container.json``), read by every
    process that starts a step (the launcher, the head's autoscaler, ``ray exec``, the
    teardown)."""

    #: the named container on each node (``container_name``)
    name: str
    #: ``srun`` arguments of every step of the cluster on a node (``start_args``)
    args: tuple[str, ...]
    #: the variables a node's step sets inside, over the image's: the package's path on
    #: ``PYTHONPATH`` and the user's ``env``
    env: Mapping[str, str]
    #: the login side's Ray and Python (``major.minor``), which the image's must be
    ray: str = ""
    python: str = ""
    #: ``srun`` arguments of an elastic worker job's one step (its ``node_run`` on each of
    #: its nodes): a container of the step's own, made from the image and removed by pyxis
    #: when the step ends, also when the job is cancelled; nothing else enters it
    job_args: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)} | {"env": dict(self.env)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContainerPlan:
        return cls(
            data["name"],
            tuple(data["args"]),
            dict(data["env"]),
            data.get("ray", ""),
            data.get("python", ""),
            tuple(data.get("job_args", ())),
        )

    def mismatch(self, ray: str, python: str) -> str | None:
        """Why an image whose Ray is ``ray`` and Python ``python`` cannot run this cluster,
        or None: the login side's ``ray`` commands and clients speak to it."""
        if (ray, python) == (self.ray, self.python):
            return None
        return (
            f"the container image has Ray {ray} and Python {python}, the login side Ray {self.ray} "
            f"and Python {self.python}: they must match (install the login side's Ray in the "
            "image, or run ray up from a Python with the image's)"
        )


def plan_container(
    config: ContainerConfig,
    cluster: str,
    job_id: str,
    state_dir: str,
    temp_base: str,
    package_root: str,
    versions: tuple[str, str],
) -> ContainerPlan:
    """The plan of a cluster's container: mounted at their own paths are the cluster's state
    dir (markers, the token, its Ray's HOME), the nodes' temp base (each container start has
    a tmpfs /tmp of its own otherwise, and the port probe's claims, Ray's temp dirs and the
    teardown must be one), and the eray-provider package the nodes import (``package_root``
    holds ``eray_provider/``: the image needs Ray, not eray-provider). ``versions``: the
    login side's Ray and Python, which every node checks its own against. The container's
    processes hand the SLURM commands they need to the host (``host_commands``: the image
    need not have SLURM's) through the state dir's ``relay``."""
    name = container_name(cluster, job_id)
    package = f"{package_root.rstrip('/')}/eray_provider"
    same_path = [state_dir, temp_base, f"{package}:{package}:ro"]
    env = {**config.env, "PYTHONPATH": package_root, RELAY_ENV: relay_path(state_dir)}
    args, job_args = start_args(config, name, same_path), start_args(config, None, same_path)
    return ContainerPlan(name, tuple(args), env, *versions, job_args=tuple(job_args))


def relay_path(state_dir: str) -> str:
    """Where a cluster's containers hand SLURM commands to the host (``host_commands``)."""
    return f"{state_dir.rstrip('/')}/relay"
