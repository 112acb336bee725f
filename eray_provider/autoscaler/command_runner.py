"""Ray's command runner over srun: how ``ray up/exec/submit/attach/down`` reach a node.

Every command becomes a step ``srun --jobid=J --overlap -N1 -n1 -w NODE bash -c ...``
with the cluster's variables (HOME, token, RAY_ADDRESS) exported first. Three commands
are not run on the node: the head's start command (the head must live in a step of its
own, held from the launcher host), a statement that is exactly ``ray stop [flags]`` (a
bare one would kill every Ray of the user on the node: this cluster's steps are
cancelled instead; see ``split_ray_stop``), and port forwarding,
which srun cannot do and is refused with what to do instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ray.autoscaler.command_runner import CommandRunnerInterface

from ..errors import ConfigError
from ..plan.cluster_config import LAUNCH_HEAD
from ..runtime.cluster_state import ClusterState
from ..runtime.launch import node_client_env
from ..runtime.ray_compat import cli_logger, runner_error
from ..slurm.srun import bash_command, clean_env, srun_argv

#: Shell operators that start a new command: a word after one is in command position.
_OPERATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n"})
_STOP_FLAG = re.compile(r"-[-A-Za-z0-9=_]*|\d+")


def _statements(cmd: str) -> list[tuple[int, str]]:
    """Top-level statements of a shell line, split at ``;`` and newlines outside quotes:
    (offset, text) each."""
    out, start, quote, i = [], 0, "", 0
    while i < len(cmd):
        c = cmd[i]
        if c == "\\" and quote != "'":
            i += 2
            continue
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in ";\n":
            out.append((start, cmd[start:i]))
            start = i + 1
        i += 1
    out.append((start, cmd[start:]))
    return out


def _words(text: str) -> list[str] | None:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None  # unbalanced quotes: the node's shell will say so


def split_ray_stop(cmd: str) -> tuple[str, bool]:
    """What of ``cmd`` to run on the node, and whether it asks to stop Ray.

    Only a statement that is exactly ``ray stop [flags]`` stops the cluster (its steps are
    cancelled: a bare ``ray stop`` on the node would kill every Ray of the user there,
    other jobs' clusters included). The statements before it still run; those after it
    are dropped (``ray exec --stop`` appends ``ray teardown ...; sudo shutdown -h now``,
    meaningless on a SLURM node). ``echo ray stop`` or ``grep "ray stop" log`` are plain
    commands. A ``ray stop`` in command position inside a compound statement (``x &&
    ray stop``) is refused with ``ValueError`` rather than run bare on a shared node.
    """
    for offset, text in _statements(cmd):
        words = _words(text) or []
        if words[:2] == ["ray", "stop"] and all(_STOP_FLAG.fullmatch(w) for w in words[2:]):
            before = cmd[:offset].rstrip().rstrip(";")
            heads = [(_words(t) or [""])[0] for _, t in _statements(before) if t.strip()]
            return (before if any(h != "export" for h in heads) else ""), True
        for prev, word, nxt in zip([";", *words], words, [*words[1:], ""]):
            if prev in _OPERATORS and word == "ray" and nxt == "stop":
                raise ConfigError(
                    f"refusing to run {cmd!r}: a `ray stop` inside a compound command would stop "
                    "every Ray of yours on the node, other clusters included; run `ray stop` "
                    "alone (this cluster's steps are cancelled) or `ray down`"
                )
    return cmd, False


def _exports(cmd: str) -> list[tuple[str, str]]:
    """The ``export K=V`` statements of a shell command line."""
    out = []
    for part in cmd.split(";"):
        words = shlex.split(part.strip()) if part.strip().startswith("export ") else []
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if sep and key.isidentifier():
                out.append((key, value))
    return out


#: Run first by a copy to or from the node: a ``~`` path is taken from the cluster's HOME,
#: entered here. Of a cluster torn down (a `ray down` that ran while `ray up` was copying)
#: the HOME is gone: the copy fails instead of making it again (`mkdir -p "$HOME/..."`
#: would), and one already inside it fails at its first write (a removed directory takes
#: no new entries).
_IN_HOME = 'cd "$HOME" || exit 3; '


def _remote_path(path: str) -> str:
    """``path`` for the node's shell, run after ``_IN_HOME``: ``~/x`` -> ``./x`` (relative
    to the cluster's HOME, never naming it); anything else quoted as is."""
    if path == "~" or path.startswith("~/"):
        return "." + shlex.quote(path[1:]) if len(path) > 1 else "."
    return shlex.quote(path)


def unpack_command(target: str, is_dir: bool) -> str:
    """The node's side of ``run_rsync_up``: stdin (a tar of a directory, or a file's
    bytes) written to ``target``."""
    dest = _remote_path(target.rstrip("/") if len(target) > 1 else target)
    if is_dir:
        return _IN_HOME + f"mkdir -p {dest} && tar -C {dest} -xf -"
    # write then rename: a reader (the head's monitor, a racing `ray up`) never sees a
    # half-written file
    return _IN_HOME + f'mkdir -p "$(dirname {dest})" && cat > {dest}.eray-$$ && mv -f {dest}.eray-$$ {dest}'


class SrunCommandRunner(CommandRunnerInterface):
    def __init__(
        self,
        state: ClusterState,
        node_id: str,
        slurm_node: str,
        launch_head: Callable[[str, dict[str, str]], None],
        stop_cluster: Callable[[], None],
    ) -> None:
        self.state = state
        self.node_id = node_id
        self.slurm_node = slurm_node
        self._launch_head = launch_head
        self._stop_cluster = stop_cluster

    # ------------------------------------------------------------------ helpers
    def _argv(self, command: list[str], pty: bool = False, timeout: float | None = None) -> list[str]:
        return srun_argv(
            self.state.job_id,
            [self.slurm_node],
            command,
            pty=pty,
            immediate=timeout,
            container=self.state.container_args(),  # in an instance of the node's container
        )

    def _env(self) -> dict[str, str]:
        return clean_env(os.environ)

    def _shell(self, cmd: str, environment_variables: dict[str, Any] | None) -> list[str]:
        exports = node_client_env(self.state, self.node_id)
        for key, val in (environment_variables or {}).items():
            # the same encoding as Ray's ssh runner, so the updater's variables read alike
            exports[key] = json.dumps(val, separators=(",", ":")) if not isinstance(val, str) else val
        return bash_command(cmd, exports)

    def _fail(self, cmd: str, code: int, exit_on_fail: bool, output: str = "") -> None:
        msg = f"Command failed on {self.slurm_node} (exit {code}): {cmd}"
        if exit_on_fail:
            cli_logger.abort(msg + (f"\n{output}" if output else ""))
        raise runner_error(msg, code=code, command=cmd)

    # ------------------------------------------------------------------ interface
    def run(
        self,
        cmd: str | None = None,
        timeout: int = 120,
        exit_on_fail: bool = False,
        port_forward: list[tuple[int, int]] | None = None,
        with_output: bool = False,
        environment_variables: dict[str, object] | None = None,
        run_env: str = "auto",
        ssh_options_override_ssh_key: str = "",
        shutdown_after_run: bool = False,
    ) -> bytes | str:
        if port_forward:
            cli_logger.abort(
                "Port forwarding is not available over srun: run `eray-provider dashboard "
                "<cluster yaml>`, which forwards a local port to the head's dashboard (through "
                "an srun step where this machine cannot reach the nodes) and prints a link that "
                "logs the browser in."
            )
        cmd = cmd or "bash -l"
        if LAUNCH_HEAD in cmd:
            # the updater passes variables both as a dict and as `export K=V;` prefixes
            env = dict(_exports(cmd))
            env.update(
                {
                    str(k): (v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
                    for k, v in (environment_variables or {}).items()
                }
            )
            self._launch_head(self.node_id, env)
            return b"" if with_output else ""
        try:
            cmd, stop = split_ray_stop(cmd)
        except ValueError as e:
            cli_logger.abort(str(e))
        if stop:
            out: bytes | str = ""
            if cmd:
                out = self.run(cmd, timeout, exit_on_fail, None, with_output, environment_variables)
            self._stop_cluster()
            return out or (b"" if with_output else "")
        interactive = not with_output and sys.stdin.isatty() and sys.stdout.isatty()
        # Ray's `timeout` is the ssh runner's ConnectTimeout: here, how long srun may wait
        # for the step (a controller that does not answer); the command runs as long as
        # it needs (setup commands)
        argv = self._argv(self._shell(cmd, environment_variables), pty=interactive, timeout=timeout)
        if with_output:
            proc = subprocess.run(argv, env=self._env(), capture_output=True, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                self._fail(cmd, proc.returncode, exit_on_fail, proc.stderr.decode(errors="replace"))
            return proc.stdout
        stdin = None if interactive else subprocess.DEVNULL
        code = subprocess.run(argv, env=self._env(), stdin=stdin).returncode
        if code != 0:
            self._fail(cmd, code, exit_on_fail)
        return ""

    def run_rsync_up(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        """Copy a local file or directory to the node through srun's stdin (no rsync, no ssh)."""
        # nothing is copied into a cluster being torn down (`ray down` ran while `ray up`
        # was setting up its head): the copy would bring back the state dir it removed
        self.state.check_launchable("copied")
        src = os.path.expanduser(source)
        is_dir = os.path.isdir(src)
        pack = ["tar", "-C", src, "-cf", "-", "."] if is_dir else ["cat", src]
        unpack = unpack_command(target, is_dir)
        try:
            self._pipe(pack, self._argv(self._shell(unpack, None)), f"copy {source} to {target}")
        except Exception:
            self.state.check_launchable("copied")  # torn down while copying: say that
            raise

    def run_rsync_down(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        """Copy a file or directory from the node to a local path."""
        src = _remote_path(source.rstrip("/") if len(source) > 1 else source)
        dest = os.path.expanduser(target)
        pack = _IN_HOME + f"if [ -d {src} ]; then tar -C {src} -cf - .; else cat {src}; fi"
        probe = self._argv(self._shell(_IN_HOME + f"test -d {src}", None))
        is_dir = subprocess.run(probe, env=self._env(), stdin=subprocess.DEVNULL).returncode == 0
        if is_dir:
            os.makedirs(dest, exist_ok=True)
            unpack = ["tar", "-C", dest, "-xf", "-"]
        else:
            os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
            unpack = ["dd", f"of={dest}", "status=none"]
        self._pipe(self._argv(self._shell(pack, None)), unpack, f"copy {source} from the node")

    def _pipe(self, first: list[str], second: list[str], what: str) -> None:
        left = subprocess.Popen(first, stdout=subprocess.PIPE, env=self._env(), stdin=subprocess.DEVNULL)
        right = subprocess.run(second, stdin=left.stdout, env=self._env(), capture_output=True)
        assert left.stdout is not None
        left.stdout.close()
        left_code = left.wait(timeout=600)
        if left_code != 0 or right.returncode != 0:
            raise runner_error(
                f"{what} failed on {self.slurm_node}: {right.stderr.decode(errors='replace')}",
                code=left_code or right.returncode,
            )

    def remote_shell_command_str(self) -> str:
        return " ".join(shlex.quote(a) for a in self._argv(["bash", "-l"], pty=True)) + "\n"

    def run_init(self, *, as_head: bool, file_mounts: dict[str, str], sync_run_yet: bool) -> None:
        return None
