"""A private dir that several node processes of one user on one host may use at once.

Before Ray 2.55 a worker's Ray ignores ``--temp-dir`` and runs in the head's temp dir path,
on its own host (``ray_compat.WORKER_TEMP_DIR_FROM_HEAD``). Where two nodes of one cluster
share a host (an elastic worker job next to the head's job, or two worker jobs), they share
that dir, and the first to end must not remove it from under the other.

The protocol: each user holds a shared ``flock`` on ``<dir>/.users`` for as long as it uses
the dir; one that leaves removes the dir only if it can take the lock exclusively (no other
holder). A newcomer that took its shared lock on a file that a leaver removed meanwhile
(the path no longer names the file it locked) starts again, with a fresh dir. The dir must
be a private (0700) dir of this user: one that another user planted is refused.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time

from ..errors import ClusterError

#: How many times ``enter`` starts again after losing a race with a leaver.
ATTEMPTS = 20


class SharedDirError(ClusterError):
    """The path is not a private dir of this user, or could not be entered."""


def check_private(path: str, st: os.stat_result) -> None:
    """Refuse what is not a dir of ours that only we can enter."""
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SharedDirError(
            f"{path} already exists and is not a private dir of yours (mode "
            f"{stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}, "
            f"{'a dir' if stat.S_ISDIR(st.st_mode) else 'not a dir'}): refused"
        )


def is_private_dir(path: str) -> bool:
    """Whether ``path`` is a dir of ours that only we can enter (not a link to one)."""
    try:
        check_private(path, os.lstat(path))
    except (OSError, SharedDirError):
        return False
    return True


class SharedDir:
    """``path``, made 0700 if missing, held from ``enter`` to ``leave``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def enter(self) -> bool:
        """Take a share of the dir; True when this call made it."""
        lock = os.path.join(self.path, ".users")
        for _ in range(ATTEMPTS):
            made = True
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                made = False
            try:
                check_private(self.path, os.lstat(self.path))
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                continue  # removed by a leaver between our mkdir and here
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(lock))
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return made
            os.close(fd)  # a leaver removed the dir while we waited for the lock
        raise SharedDirError(f"could not enter {self.path} in {ATTEMPTS} attempts (removed each time)")

    def leave(self, remove: bool = True) -> bool:
        """Give up this share; remove the dir when no other holds one (and ``remove``: a dir
        whose name others have seen is kept for the next node that takes that path, which
        another user could otherwise make first). True if removed."""
        fd, self._fd = self._fd, None
        if fd is None:
            return False
        if not remove:
            os.close(fd)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise
            os.close(fd)
            return False  # another node of the cluster still runs in it
        try:
            remove_tree(self.path)
        finally:
            os.close(fd)
        return True


#: How long ``remove_tree`` watches a removed dir for a Ray process that makes it again.
SETTLE_SECONDS = 1.0
#: The most ``remove_tree`` spends on one dir (a node's stop has SLURM's ``KillWait``, 30 s
#: by default, for its Ray, its helpers, its logs and two of these).
REMOVE_SECONDS = 5.0


def remove_tree(path: str) -> None:
    """``rm -rf``, again while it comes back, until it has stayed away ``SETTLE_SECONDS``
    (at most ``REMOVE_SECONDS``): Ray processes that outlive their raylet (a stopping
    Ray, on a loaded node) may still make their log dirs in it a moment after it went."""
    deadline = time.monotonic() + REMOVE_SECONDS
    gone_since: float | None = None
    while True:
        now = time.monotonic()
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
            gone_since = None
        elif gone_since is None:
            gone_since = now
        elif now - gone_since >= SETTLE_SECONDS:
            return
        if now > deadline:
            return
        time.sleep(0.1)
