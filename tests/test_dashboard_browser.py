"""index.html in a real browser: headless Debian chromium driven over the DevTools protocol.

The protocol runs over `--remote-debugging-pipe` (JSON messages separated by NUL on file descriptors
3 and 4), so the test needs no websocket library, no open port and no network. It loads the demo
report, waits for the page, checks that every figure decoded and every table has rows, clicks a
header to sort, collects console errors, exceptions and log errors (CSP violations and failed loads
land there), and saves a screenshot. A first page with a deliberate error proves the collector sees
errors at all.

Set FP8EVAL_DASHBOARD_SCREENSHOT=docs/img/dashboard.png to also write the README's screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import importlib.util
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fp8eval.report import write_report

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")


def _ensure_chromium() -> Path:
    if not CHROMIUM.exists():
        res = subprocess.run(["bash", str(REPO / "scripts" / "install_chromium.sh")], capture_output=True,
                             text=True, timeout=900)
        if res.returncode != 0 or not CHROMIUM.exists():
            msg = f"chromium could not be installed: {res.stderr[-2000:]}"
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
    return CHROMIUM


class PipeBrowser:
    """A headless chromium and a minimal DevTools-protocol client over its debugging pipe."""

    def __init__(self, binary: Path, profile: Path, log: Path):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        fds = (to_chrome_r, from_chrome_w)

        def child_fds():  # chromium reads commands on fd 3 and writes replies on fd 4
            hi = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
            os.dup2(hi[0], 3)
            os.dup2(hi[1], 4)

        args = [str(binary), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-sync", "--hide-scrollbars", "--mute-audio",
                f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     preexec_fn=child_fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no DevTools message from chromium in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe (crashed?)")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method and e.get("sessionId") == session:
                return e
        while True:
            e = self._read_message(deadline)
            self.events.append(e)
            if e.get("method") == method and e.get("sessionId") == session:
                return e

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except TimeoutError:
            pass

    def open(self, url: str, width: int = 1400, height: int = 1000) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session)
        self.pump(1.0)  # late console messages and log entries
        return session

    def evaluate(self, session: str, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, session=session)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def errors(self, session: str) -> list[str]:
        out = []
        for e in self.events:
            if e.get("sessionId") != session:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + json.dumps(p.get("args", []))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", "")[:500])
        return out

    def screenshot(self, session: str, path: Path, max_height: int | None = None) -> None:
        metrics = self.send("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        height = size["height"] if max_height is None else min(size["height"], max_height)
        data = self.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": height, "scale": 1}},
            session=session)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        self._log.close()


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("report_fixtures", REPO / "tests/data/report/make_fixtures.py")
    fx = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fx)
    root = tmp_path_factory.mktemp("demo")
    fx.make_demo(root)
    return write_report([root], root / "report", n_boot=500)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary = _ensure_chromium()
    tmp = tmp_path_factory.mktemp("chromium")
    b = PipeBrowser(binary, tmp / "profile", tmp / "chromium.log")
    yield b
    b.close()


def test_error_collector_sees_errors(browser, tmp_path):
    """Guards the test below: a page with a script error, a console.error and a blocked remote image
    must be reported, or 'no errors' would prove nothing."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><head><meta http-equiv='Content-Security-Policy' "
                    "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
                    "<img src='https://example.invalid/x.png'><script>console.error('boom');"
                    "undefinedFunction();</script></body></html>")
    session = browser.open(page.as_uri())
    errors = browser.errors(session)
    assert any("boom" in e for e in errors), errors
    assert any(e.startswith("exception") for e in errors), errors
    assert any("Content Security Policy" in e or "example.invalid" in e for e in errors), errors


def test_dashboard_renders_without_errors(browser, demo_report, tmp_path):
    session = browser.open((demo_report / "index.html").as_uri())
    assert browser.evaluate(session, "document.body.dataset.ready") == "1"
    n_figures = len(list((demo_report / "figures").glob("*.png")))
    imgs = browser.evaluate(session, """Promise.all([...document.images].map(i => i.decode()
        .then(() => [i.alt, i.naturalWidth, i.getBoundingClientRect().width])
        .catch(() => [i.alt, 0, 0])))""")
    assert len(imgs) == n_figures >= 6, imgs
    assert all(w > 100 and shown > 100 for _, w, shown in imgs), imgs
    # The first figure answers the question: recovery with its CI against the gate, a verdict per point.
    assert imgs[0][0].startswith("Recovery with its 95% CI against the gate"), imgs
    first = browser.evaluate(session, """(() => {const f = document.querySelector('#figures figure');
        return [f.querySelector('img').alt, f.querySelector('figcaption').textContent];})()""")
    assert "gate" in first[1] and "inconclusive" in first[1], first
    tables = browser.evaluate(session, """[...document.querySelectorAll('table.sortable')]
        .map(t => [t.id, t.tBodies[0].rows.length, t.getBoundingClientRect().height])""")
    ids = {t[0]: t for t in tables}
    assert {"headline", "recovery", "arms", "flips", "signtests"} <= set(ids), tables
    assert all(rows > 0 and height > 20 for _, rows, height in tables), tables
    # Readable headers: no snake_case on the page (the CSVs keep the column names).
    heads = browser.evaluate(session, "[...document.querySelectorAll('th')].map(th => th.textContent)")
    assert heads and not [h for h in heads if "_" in h], heads
    # Nothing is clipped: at 1400 px and at 1920 px no table is wider than its section, and every verdict's reason
    # is a wrapped paragraph that fits the page.
    for width in (1400, 1920):
        browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 1000, "deviceScaleFactor": 1,
                                                            "mobile": False}, session=session)
        overflow = browser.evaluate(session, """[...document.querySelectorAll('table#headline, table#signtests')]
            .map(t => [t.id, t.getBoundingClientRect().width, t.parentElement.clientWidth])
            .filter(([, w, room]) => w > room + 1)""")
        assert overflow == [], (width, overflow)
        why = browser.evaluate(session, """[...document.querySelectorAll('ul.why li')].map(li =>
            [li.getBoundingClientRect().right <= document.documentElement.clientWidth, li.textContent.length])""")
        assert why and all(fits for fits, _ in why) and max(n for _, n in why) > 150, (width, why)
    browser.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 1000, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=session)
    # Sorting: click the recovery column of the per-group table, twice.
    col = browser.evaluate(session, """[...document.querySelectorAll('#recovery th')]
        .findIndex(th => th.dataset.col === 'recovery_pct')""")
    values = f"""[...document.querySelectorAll('#recovery tbody tr')].map(r => r.cells[{col}].dataset.v)
        .filter(v => v !== '').map(Number)"""
    browser.evaluate(session, f"document.querySelectorAll('#recovery th')[{col}].click()")
    up = browser.evaluate(session, values)
    browser.evaluate(session, f"document.querySelectorAll('#recovery th')[{col}].click()")
    down = browser.evaluate(session, values)
    assert up == sorted(up) and down == sorted(down, reverse=True) and len(up) > 5
    errors = browser.errors(session)
    assert errors == [], errors
    shot = tmp_path / "dashboard.png"
    browser.screenshot(session, shot, max_height=1800)
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("FP8EVAL_DASHBOARD_SCREENSHOT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
    print(f"screenshot: {shot}")
