"""Ray's config cache, made safe on a shared login node.

Ray's CLI caches a bootstrapped config in ``$TMPDIR/ray-config-<hash of the prepared
YAML>`` (SHA-1 before Ray 2.54, SHA-256 since: ``ray_compat.CONFIG_CACHE_DIGEST``) and, on
the next command with the same YAML, loads it with no check of who wrote it. ``/tmp`` is
world-writable and the name is computable by anyone who knows the YAML (the stock
``cluster_yamls/*.yaml``), so another user could plant a cache whose ``provider.python``
or setup commands are theirs, to be run as you on your allocation.

What the provider does about it:

- ``refuse_unsafe`` (the provider's first act in every CLI process, before any of the
  cached config is used): a cache that is not a regular file owned by you with no group
  or other permission bits is refused, removed where this process may remove it, and the
  command stops with a message naming the file.
- ``write_private`` (when Ray resolves a config afresh, just before Ray writes its cache):
  the cache is created by us with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600, so
  Ray's own ``open(path, "w")`` fills our private file instead of following a planted
  symlink or writing into another user's file. Anything already at the path that is not
  ours is refused the same way.

What it cannot do: when a planted cache names another provider module, Ray imports that
module before any code of ours runs. The remedy is a private ``TMPDIR`` for the Ray CLI on
shared machines (see docs/security.md) or ``--no-config-cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from typing import Any

from ..errors import ClusterError
from ..runtime.ray_compat import CONFIG_CACHE_DIGEST

#: ``commands.CONFIG_CACHE_VERSION`` of Ray 2.52 to 2.60: a cache of another version is not loaded.
CACHE_VERSION = 1


class UnsafeConfigCacheError(ClusterError):
    """A config cache that may have been written by someone else."""


def cache_path(prepared_config: dict[str, Any]) -> str:
    """Where Ray caches ``prepared_config`` (the YAML after ``prepare_config``), computed as
    Ray's ``_bootstrap_config`` computes it."""
    text = json.dumps([prepared_config], sort_keys=True).encode("utf-8")
    digest = hashlib.new(CONFIG_CACHE_DIGEST, text).hexdigest()
    return os.path.join(tempfile.gettempdir(), f"ray-config-{digest}")


def problem(st: os.stat_result) -> str | None:
    """Why a file with this ``lstat`` result cannot be trusted as ours, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}: others could have written it"
    return None


def refuse_unsafe(path: str) -> None:
    """Raise ``UnsafeConfigCacheError`` when ``path`` exists and is not provably ours; the
    file is removed first where this process may (yours, or any as root)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    why = problem(st)
    if why is None:
        return
    try:
        os.unlink(path)
        fate = "it was removed"
    except OSError as e:
        fate = f"it could not be removed ({e.strerror}): ask its owner or an admin to remove it"
    raise UnsafeConfigCacheError(
        f"refusing Ray's cached cluster config {path}: {why}; nothing of it was used and {fate}. "
        "Run the command again. On a shared machine give the Ray CLI a private temp dir "
        '(export TMPDIR="$(mktemp -d)") or pass --no-config-cache.'
    )


def write_private(path: str, config: dict[str, Any]) -> None:
    """Create the cache for ``config`` ourselves, mode 0600, never through a link, never
    into an existing file; what Ray writes next lands in this file."""
    refuse_unsafe(path)
    try:
        os.unlink(path)  # our own earlier cache (of another Ray version, say)
    except FileNotFoundError:
        pass
    doc = {"_version": CACHE_VERSION, "provider_log_info": None, "config": config}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError as e:
        raise UnsafeConfigCacheError(
            f"refusing to write Ray's config cache {path}: a file appeared there while it was "
            "being created; run the command again with a private TMPDIR"
        ) from e
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc))
