"""SharedDir: a private dir several node processes on one host use at once (Ray before
2.55 gives every worker the head's temp dir path); the last to leave removes it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from eray_provider.runtime.shared_dir import SharedDir, SharedDirError, remove_tree


def test_made_private_and_removed_by_its_only_user(tmp_path) -> None:
    d = SharedDir(str(tmp_path / "eray-1-x"))
    assert d.enter() is True
    assert (os.stat(d.path).st_mode & 0o777) == 0o700
    (tmp_path / "eray-1-x" / "ray").mkdir()
    assert d.leave() is True and not os.path.exists(d.path)
    assert d.leave() is False  # twice is harmless


def test_the_first_to_leave_keeps_it_for_the_other(tmp_path) -> None:
    path = str(tmp_path / "eray-1-x")
    head, worker = SharedDir(path), SharedDir(path)
    assert head.enter() is True and worker.enter() is False
    assert head.leave() is False and os.path.isdir(path)
    assert worker.leave() is True and not os.path.exists(path)


def test_an_existing_private_dir_of_ours_is_entered_and_a_newcomer_after_removal_gets_a_fresh_one(
    tmp_path,
) -> None:
    path = tmp_path / "eray-1-x"
    path.mkdir(mode=0o700)
    first = SharedDir(str(path))
    assert first.enter() is False
    assert first.leave() is True and not path.exists()
    again = SharedDir(str(path))
    assert again.enter() is True and path.is_dir()
    again.leave()


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o777])
def test_a_dir_others_can_enter_is_refused(tmp_path, mode: int) -> None:
    path = tmp_path / "eray-1-x"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(SharedDirError, match=f"mode {mode:04o}"):
        SharedDir(str(path)).enter()
    assert path.is_dir()  # refused, not removed


def test_a_symlink_or_another_users_dir_is_refused(tmp_path) -> None:
    target = tmp_path / "victim"
    target.mkdir(mode=0o700)
    link = tmp_path / "eray-1-x"
    link.symlink_to(target)
    with pytest.raises(SharedDirError, match="not a dir"):
        SharedDir(str(link)).enter()
    if os.getuid() == 0:
        theirs = tmp_path / "eray-1-y"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(SharedDirError, match="uid 65534"):
            SharedDir(str(theirs)).enter()


def test_a_dir_made_again_just_after_its_removal_is_removed_again(tmp_path) -> None:
    """A stopping Ray process makes its log dir again a moment after the node removed its
    temp dir: the removal waits until the dir has stayed away, and takes it again."""
    path = tmp_path / "eray-7-x"
    (path / "logs").mkdir(parents=True)

    def late_writer() -> None:
        deadline = time.monotonic() + 10
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        (path / "logs").mkdir(parents=True, exist_ok=True)  # as Ray's log monitor would
        (path / "logs" / "raylet.out").write_text("late")

    writer = threading.Thread(target=late_writer)
    writer.start()
    remove_tree(str(path))
    writer.join(timeout=30)
    assert not path.exists()
