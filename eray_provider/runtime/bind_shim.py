"""Keeping a cluster's listeners off all interfaces: the preloaded bind shim (bindshim.c).

Ray 2.60 binds its gRPC servers and metrics endpoints to 0.0.0.0 / [::] with no option to
change it. ``node_run`` preloads ``eray_provider.runtime._bindshim`` into the node's Ray so that
wildcard binds of the cluster's ports go to the node's address, and loopback connects to
those ports (Ray reaches its local metrics agent at 127.0.0.1) follow them.
``provider.bind_all_interfaces: true`` turns this off.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence

from ..errors import ClusterError
from ..plan.environment import BIND_ADDRESS, BIND_PORTS, HELD_PORTS
from ..plan.modules import BIND_SHIM
from ..plan.ports import BLOCK, PortPlan, held_ranges, ranges_text


class BindShimError(ClusterError):
    """The shim cannot be preloaded: Ray would listen on all interfaces."""


def shim_path() -> str | None:
    """The built shim (a shared library), or None when the package was installed without it."""
    spec = importlib.util.find_spec(BIND_SHIM)
    return spec.origin if spec is not None and spec.origin else None


def port_ranges(plans: Iterable[PortPlan]) -> str:
    """``lo-hi,...``: the port blocks of the given plans (the node's own and the head's,
    whose JAX ports a coordinator on this node may bind), without the dashboard's port: the
    dashboard binds the address it is given, and with ``dashboard_host: 127.0.0.1`` its
    loopback clients must not be sent elsewhere."""
    ranges: list[tuple[int, int]] = []
    for plan in plans:
        end = plan.block_start + BLOCK - 1
        for lo, hi in ((plan.block_start, plan.dashboard - 1), (plan.dashboard + 1, end)):
            if lo <= hi:
                ranges.append((lo, hi))
    return ranges_text(dict.fromkeys(ranges))


def bind_env(shim: str, ip: str, plans: Sequence[PortPlan], env: Mapping[str, str]) -> dict[str, str]:
    """Variables that preload the shim for ``ip`` and the plans' ports (after any preload
    the environment already has). Ray then skips its own jemalloc preload. The plans' named
    ports are said to be held on loopback (``loopback_hold``): a loopback listener of ours
    there joins the hold.

    ``LD_PRELOAD`` is split at spaces and colons, so a shim installed under such a path
    (a virtualenv in ``/home/a b/``) cannot be named there: that is an error, never a
    silent fallback to listening on all interfaces."""
    if any(c.isspace() or c == ":" for c in shim):
        raise BindShimError(
            f"the bind shim's path {shim!r} holds a space or ':', which LD_PRELOAD cannot carry: "
            "install eray-provider under a path without them, or set provider.bind_all_interfaces: true"
        )
    preload = " ".join(p for p in (shim, env.get("LD_PRELOAD", "")) if p)
    return {
        "LD_PRELOAD": preload,
        BIND_ADDRESS: ip,
        BIND_PORTS: port_ranges(plans),
        HELD_PORTS: ranges_text(held_ranges(plans)),
        # the raylet passes the preload on to its workers (their gRPC servers bind too)
        "RAY_LD_PRELOAD_ON_WORKERS": "1",
    }


def check_preloaded(shim: str, env: Mapping[str, str]) -> None:
    """Raise ``BindShimError`` unless a program started with ``env`` has the shim loaded.

    The dynamic loader only warns about a preload it cannot load (and goes on without it),
    so node_run asks a tiny program, ``grep``, whether the shim is in its own memory map."""
    proc = subprocess.run(
        ["grep", "-qF", os.path.realpath(shim), "/proc/self/maps"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise BindShimError(
            f"the bind shim {shim} is not loaded with LD_PRELOAD={env.get('LD_PRELOAD', '')!r} "
            f"({proc.stderr.strip() or 'not in the memory map'}): Ray would listen on all interfaces; "
            "reinstall eray-provider with a C compiler, or set provider.bind_all_interfaces: true"
        )
