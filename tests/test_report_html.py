"""report.html rendered in headless Chromium: it loads with no console errors and no network requests, every
figure decodes, it fits a phone screen, and names taken from records show as text (no script runs).

Chromium is driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON messages ending in
NUL on file descriptors 3 and 4), so the test sees console messages, exceptions, dialogs and requests as events
instead of scraping logs. Skips with the reason when no Chromium is installed (``scripts/setup.sh --test``
installs Debian's ``chromium``; ``TRAINBENCH_CHROMIUM`` points at another binary).
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bench.records.results import ResultStore, TrialRecord
from bench.report import write_report

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report"
HOSTILE = "<script>alert(1)</script>"
TIMEOUT_S = 60.0


def _chromium() -> str | None:
    for candidate in (os.environ.get("TRAINBENCH_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class DevTools:
    """A headless Chromium and one page, driven over the DevTools pipe."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Move the child's ends above 9 first, so mapping them onto 3 and 4 cannot clobber one with the other.
        high_r, high_w = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(from_chrome_w,
                                                                                          fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._stderr = profile / "stderr.log"
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", "--mute-audio", "--hide-scrollbars", f"--user-data-dir={profile}",
                "--remote-debugging-pipe", "about:blank"]
        # The browser reads commands on fd 3 and writes replies on fd 4 (dup2 clears close-on-exec there).
        self.pid = os.posix_spawn(exe, args, os.environ, file_actions=[
            (os.POSIX_SPAWN_DUP2, high_r, 3),
            (os.POSIX_SPAWN_DUP2, high_w, 4),
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, str(self._stderr), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        ])
        os.close(high_r)
        os.close(high_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    # ---- protocol ---------------------------------------------------------------------------------------------

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("no reply from Chromium within the timeout")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe: {self._stderr.read_text(errors='replace')[-2000:]}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event.get("method") == "Page.javascriptDialogOpening":  # an alert blocks the page until answered
            message = {"id": 0, "method": "Page.handleJavaScriptDialog", "params": {"accept": True},
                       "sessionId": self.session}
            os.write(self._to_chrome, json.dumps(message).encode() + b"\0")

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self._event(self._read(deadline))

    # ---- page ----------------------------------------------------------------------------------------------

    def viewport(self, width: int, height: int, mobile: bool) -> None:
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})

    def open(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", {"url": path.resolve().as_uri()})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])

    def problems(self, page: Path) -> list[str]:
        """Console errors, uncaught exceptions, dialogs and any request that is not the page itself or data:."""
        out = []
        page_url = page.resolve().as_uri()
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log: {params['entry'].get('text')}")
            elif method == "Page.javascriptDialogOpening":
                out.append(f"dialog: {params.get('message')}")
            elif method == "Network.requestWillBeSent":
                url = params.get("request", {}).get("url", "")
                if not (url == page_url or url.startswith("data:")):
                    out.append(f"request: {url}")
        return out

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False)
        except (RuntimeError, TimeoutError, OSError):
            pass
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.05)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium found (/usr/bin/chromium, PATH, or TRAINBENCH_CHROMIUM); "
                    "scripts/setup.sh --test installs it")
    tools = DevTools(exe, tmp_path_factory.mktemp("chromium-profile"))
    yield tools
    tools.close()


@pytest.fixture(scope="module")
def report_page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    return write_report([FIXTURE], out_dir=out, formats=["html"])["html"]


CHECKS = """JSON.stringify({
  figures: document.documentElement.dataset.figures,
  count: document.images.length,
  widths: Array.from(document.images).map(i => i.naturalWidth),
  scripts: document.scripts.length,
  h3: Array.from(document.querySelectorAll("h3")).map(h => h.textContent),
  tables: document.querySelectorAll("table").length,
  pageWidth: document.documentElement.scrollWidth,
  viewWidth: window.innerWidth,
  text: document.body.innerText
})"""


def _state(browser: DevTools) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    while browser.evaluate("document.documentElement.dataset.figures || ''") == "":
        if time.monotonic() > deadline:
            raise TimeoutError("the page's figure check never ran")
        time.sleep(0.05)
    return json.loads(browser.evaluate(CHECKS))


def _painted(png: bytes) -> int:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colors = image.getcolors(maxcolors=1 << 20)
    return len(colors) if colors else 1 << 20


def test_report_loads_without_errors_and_every_figure_decodes(browser, report_page):
    browser.viewport(1280, 2400, mobile=False)
    browser.open(report_page)
    state = _state(browser)
    assert browser.problems(report_page) == []
    assert state["figures"] == "ok" and state["count"] == 5 and all(w > 300 for w in state["widths"])
    assert state["scripts"] == 1 and state["tables"] >= 5
    assert state["h3"] == ["gpt:tiny", "mlp:tiny"]
    assert "fastest: bf16 at 1.90x [1.74, 2.08] faster" in state["text"]
    png = browser.screenshot()
    assert png.startswith(b"\x89PNG") and _painted(png) > 50  # text, tables and figures, not a blank page


def test_report_fits_a_phone_screen(browser, report_page):
    browser.viewport(390, 844, mobile=True)
    browser.open(report_page)
    state = _state(browser)
    assert browser.problems(report_page) == []
    assert state["viewWidth"] == 390
    # wide tables scroll inside their own box; the page itself never scrolls sideways
    assert state["pageWidth"] <= state["viewWidth"], state["pageWidth"]
    widths = json.loads(browser.evaluate(
        "JSON.stringify(Array.from(document.querySelectorAll('.scroll, .figwrap'))"
        ".map(e => e.getBoundingClientRect().right))"))
    assert widths and max(widths) <= 390
    assert _painted(browser.screenshot()) > 50


def test_names_from_records_show_as_text(browser, tmp_path):
    src = tmp_path / "hostile"
    src.mkdir()
    shutil.copy(FIXTURE / "env.json", src / "env.json")
    store = ResultStore(src / "results.jsonl")
    for r in ResultStore(FIXTURE / "results.jsonl").read():
        d = r.to_dict()
        if d["workload"]["name"] == "mlp":
            d["workload"]["name"] = HOSTILE
        if d["technique_label"] == "bf16":
            d["technique_label"] = 'bf16"><img src=x onerror=alert(2)>$x$'
        store.append(TrialRecord.from_dict(d))
    page = write_report([src], out_dir=tmp_path / "out", formats=["html"])["html"]
    raw = page.read_text()
    assert HOSTILE not in raw and "<img src=x" not in raw
    browser.viewport(1280, 2400, mobile=False)
    browser.open(page)
    state = _state(browser)
    assert browser.problems(page) == []  # no alert dialog, no blocked request, no error
    assert state["scripts"] == 1 and state["figures"] == "ok"
    assert f"{HOSTILE}:tiny" in state["h3"]
    assert 'bf16"><img src=x onerror=alert(2)>$x$' in state["text"]


def test_duplicated_trial_ids_are_said_in_the_page(tmp_path):
    # no browser needed: the note is a plain paragraph at the top, escaped like every string from the input
    src = tmp_path / "a<b"
    src.mkdir()
    shutil.copy(FIXTURE / "env.json", src / "env.json")
    lines = (FIXTURE / "results.jsonl").read_text().splitlines()
    (src / "results.jsonl").write_text("\n".join(lines + lines[:2]) + "\n")  # two trial ids written twice
    raw = write_report([src], out_dir=tmp_path / "out", formats=["html"])["html"].read_text()
    note = (f"{tmp_path}/a&lt;b/results.jsonl holds 2 duplicated trial ids (a second sweep wrote into the same "
            "directory?); each was counted once, the first record kept")
    assert f'<p class="note"><strong>Input:</strong> {note}</p>' in raw
    assert "25 trials," in raw  # the subtitle counts each trial once
