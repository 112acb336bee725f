"""``eray-provider dashboard`` on the test bed, opened by headless Chromium: a 3-node
cluster's dashboard through an srun relay step and directly, the token reaching the
browser as Ray's cookie, a request without it refused, no step left after Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ray_cluster_support import Cluster
from testbed_support import REPO, Testbed, require

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


def _chromium() -> str:
    """Debian's headless Chromium, installed with apt when missing."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=900
        )
        found = shutil.which("chromium")
    if found is None:
        require("chromium is not installed and apt-get could not install it")
    return str(found)


def _browser(chromium: str, profile: Path, url: str, *args: str) -> str:
    """What headless Chromium shows at ``url`` (its DOM), with cookies kept in ``profile``."""
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",  # as root
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout


def _steps(testbed: Testbed, job: str) -> list[str]:
    return testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"]).stdout.split()


class Forwarding:
    """``eray-provider dashboard`` running, its output read as it comes."""

    def __init__(self, cluster: Cluster, via: str) -> None:
        self.proc = subprocess.Popen(
            ["eray-provider", "dashboard", str(cluster.config), "--port", "0", "--via", via],
            env=cluster.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=str(REPO),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.seen: list[str] = []

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def link(self, timeout: float = 60) -> str:
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                line = None
            if line is None:
                self.proc.kill()
                raise AssertionError(f"no dashboard link within {timeout} s: {self.seen}")
            self.seen.append(line)
            m = re.search(r"http://127\.0\.0\.1:\d+/eray-provider/login/\S+", line)
            if m:
                return m.group(0)

    def interrupt(self, sig: int = signal.SIGINT, timeout: float = 150) -> str:
        """Ctrl-C (or ``sig``); returns all it printed. Bounded by the relay's own stop: 5 s
        to close its input, ``STOP_SECONDS``, then SIGTERM and SIGKILL of its srun (10 s
        each) and a scancel of the step waited for up to 30 s, each SLURM command with its
        timeout."""
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def _login_cookie(link: str) -> str:
    """``name=value`` of the cookie the login link sets (the redirect is not followed)."""
    import http.client
    import urllib.parse

    url = urllib.parse.urlsplit(link)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", url.path)
        r = conn.getresponse()
        r.read()
        assert r.status == 303, r.status
        return r.headers["Set-Cookie"].split(";")[0]
    finally:
        conn.close()


def _status(url: str, cookie: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Cookie": cookie}), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_dashboard_in_a_browser_through_srun_and_direct(testbed: Testbed, tmp_path) -> None:
    chromium = _chromium()
    job = testbed.salloc("-N3", "-c1", "--mem=1500", "-J", "eray-dash-test")
    cluster = Cluster(testbed, job, tmp_path, "dash")
    out = REPO / ".test-output" / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    try:
        cluster.up()
        token = (cluster.state_dir / "auth_token").read_text().strip()
        head_ip = cluster.exec("echo $RAY_ADDRESS").stdout.strip().splitlines()[-1].split(":")[0]
        dash_port = json.loads((cluster.state_dir / "ports.json").read_text())["dashboard"]
        dashboard = f"http://{head_ip}:{dash_port}"
        for via in ("srun", "direct"):
            fwd = Forwarding(cluster, via)
            link = fwd.link()
            base = link.split("/eray-provider/")[0]
            try:
                relay = [s for s in _steps(testbed, job) if s.startswith("eray.dash.dashboard.")]
                assert len(relay) == (1 if via == "srun" else 0), _steps(testbed, job)
                if via == "srun":
                    # a second forward of the same cluster at once: its own port, step and
                    # session; ending it ends only its own step
                    other = Forwarding(cluster, via)
                    other_link = other.link()
                    other_base = other_link.split("/eray-provider/")[0]
                    try:
                        assert other_base != base
                        cookie2 = _login_cookie(other_link)
                        assert _status(f"{other_base}/nodes?view=summary", cookie2) == 200
                        both = [s for s in _steps(testbed, job) if s.startswith("eray.dash.dashboard.")]
                        assert len(both) == 2 and relay[0] in both, both
                    finally:
                        other.interrupt()
                    assert [s for s in _steps(testbed, job) if s.startswith("eray.dash.dashboard.")] == relay

                # no token, or a wrong link: the dashboard refuses, as it would anyone
                for url in (f"{base}/nodes?view=summary", f"{base}/eray-provider/login/wrong"):
                    with pytest.raises(urllib.error.HTTPError) as refused:
                        urllib.request.urlopen(url, timeout=30)
                    assert refused.value.code == 401, url
                    assert "ray-authentication-token" not in str(refused.value.headers)

                # the browser follows the link (the cookie is set) to the nodes' API
                profile = tmp_path / f"profile-{via}"
                dom = _browser(chromium, profile, f"{link}?next=/nodes%3Fview%3Dsummary", "--dump-dom")
                text = re.sub(r"<[^>]+>", "", dom)
                doc = json.loads(text[text.index("{") : text.rindex("}") + 1])
                alive = [n for n in doc["data"]["summary"] if n["raylet"]["state"] == "ALIVE"]
                assert len(alive) == 3, doc
                assert sorted(n["raylet"]["labels"]["slurm-node"] for n in alive) == [
                    "node1",
                    "node2",
                    "node3",
                ]
                # and the dashboard's page, as the user sees it
                shot = out / f"dashboard-{via}.png"
                shot.unlink(missing_ok=True)
                _browser(
                    chromium, profile, f"{base}/#/cluster", f"--screenshot={shot}", "--window-size=1280,900"
                )
                assert shot.exists() and shot.stat().st_size > 10_000

                # what the browser holds is a session of this forward, never the token; it
                # opens the dashboard through the forward only
                cookie = _login_cookie(link)
                assert cookie.startswith("eray-forward-") and token not in cookie
                assert _status(f"{base}/nodes?view=summary", cookie) == 200

                if via == "srun":
                    # Ray's Jobs SDK through the forward, with what `eray-provider env` prints
                    exports = testbed.run(["eray-provider", "env", str(cluster.config)], env=cluster.env)
                    env = dict(cluster.env)
                    for line in exports.stdout.splitlines():
                        name, _, value = line.removeprefix("export ").partition("=")
                        env[name] = shlex.split(value)[0]
                    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"].endswith(
                        "auth_token"
                    )
                    sdk = testbed.run(
                        [sys.executable, str(REPO / "tests" / "drivers" / "jobs_sdk.py"), base],
                        env=env,
                        timeout=300,
                    )
                    assert sdk.stdout.splitlines()[-1] == "OK", sdk.stdout + sdk.stderr[-2000:]
            finally:
                # SLURM's SIGTERM (a time limit) ends the srun forward as Ctrl-C ends the other
                rest = fwd.interrupt(signal.SIGTERM if via == "srun" else signal.SIGINT)
            assert fwd.proc.returncode == 0, rest
            said = "SIGTERM" if via == "srun" else "Ctrl-C"
            assert f"dashboard forwarding ended: {said}" in rest, rest[-2000:]
            assert not [s for s in _steps(testbed, job) if s.startswith("eray.dash.dashboard")]
            # once the forward has ended, a captured cookie (a co-tenant who binds the freed
            # port gets what the open tab sends) opens nothing at the dashboard itself
            assert _status(f"{dashboard}/nodes?view=summary", cookie) in (401, 403)
            assert _status(f"{dashboard}/nodes?view=summary", f"ray-authentication-token={token}") == 200
    finally:
        cluster.down(check=False)
        testbed.cancel(job)
