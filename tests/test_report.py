"""evaluate/report.py on the finished end-to-end run (conftest's ``finished_run``): one
self-contained, deterministic HTML file with every section, opened in a real headless Chromium
(Debian's ``chromium``): it renders, every image decodes, no script or console errors. A copy with
a broken image and planted errors shows that those checks do fail when they should.

Without chromium the browser tests skip, unless COUNTERAUDIT_REQUIRE_CHROMIUM=1 (CI), where they fail.
"""
from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import REPO, run_in_process

CHROMIUM = "/usr/bin/chromium"
SECTIONS = ["summary", "detection", "localization", "implants", "detection-examples", "localization-examples",
            "distributions", "roc"]
DATA_URI = re.compile(r'<img[^>]* src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
# The tiny run: 2 methods x 2 anomalies x (input, reference, model) detection examples, and for
# the one localizable model 2 inputs + 2 methods x 2 inputs x (reference, model).
EXPECTED_IMAGES = 2 * 2 * 3 + 2 + 2 * 2 * 2


def report_args(suite, runs, *extra):
    return ["--suite", suite, "--runs-dir", runs, "--no-progress", "--jobs", 1, *extra]


@pytest.fixture(scope="module")
def report(finished_run):
    suite, runs, _ = finished_run
    out = run_in_process("evaluate/report.py", *report_args(suite, runs, "--distance", "l2"))
    path = runs / "e2e" / "report" / "report.html"  # the default --output
    return path, out


def test_report_is_one_self_contained_file_with_every_section(report, finished_run, tmp_path):
    path, out = report
    assert path.is_file() and str(path) in out.strip().splitlines()[-1]
    html = path.read_text()
    for section in SECTIONS:
        assert f'<section id="{section}">' in html, section
    assert "Table 1" in html and "Table 2" in html and "Distance:</b> l2" in html
    # the report leads with what the run found: the summary is the header's first section
    header = html.split("</header>")[0]
    assert header.index('<section id="summary">') < header.index('id="distance"')
    assert "What this run found" in header and "Detection (Table 1)" in header
    assert 'class="num v-' in html  # Table 1's and Table 2's cells carry verdict colours
    # no null models: the first screen says its detections are the paper's rule, with the suite's
    # n, and never prints one in the failures' red
    assert ("Basis:</b> one seed per configuration and 3 references: counts by the paper&#x27;s "
            "rule, not statistical verdicts." in header)
    assert "flags 1 model in 4" in html and 'class="fail">detected' not in html
    assert "<svg" in html and "AUROC" in html and "implant took" in html
    assert "uses 3 references and p = 4 images per set" in html
    # self-contained: nothing fetched from anywhere
    assert "http://" not in html and "https://" not in html and "<link" not in html and "url(" not in html
    images = DATA_URI.findall(html)
    assert len(images) == html.count("<img ") == EXPECTED_IMAGES
    for encoded in images:  # every embedded image is a PNG that decodes
        assert Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB").size[0] > 0
    # deterministic: the same run gives the same bytes (made again in this process)
    suite, runs, _ = finished_run
    again = tmp_path / "again.html"
    run_in_process("evaluate/report.py", *report_args(suite, runs, "--distance", "l2", "--output", again))
    assert again.read_bytes() == path.read_bytes()


def test_report_header_says_the_distance_and_an_offline_run_downloads_nothing(finished_run,
                                                                              tmp_path):
    """No --distance, offline, no LPIPS weights: the suite's distance (here the default, l2) is
    used as it would be online, the header says where it was chosen, and no download is tried."""
    suite, runs, _ = finished_run
    output = tmp_path / "offline.html"
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "empty-hub"), "NO_PROXY": "", "no_proxy": "",
           "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}  # offline for sure
    result = subprocess.run([sys.executable, str(REPO / "evaluate/report.py"),
                             *map(str, report_args(suite, runs, "--output", output))],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    header = output.read_text().split("</header>")[0]
    assert ('Distance:</b> l2 <span class="note">(chosen by the default: the suite sets no [evaluate] distance)'
            in header)
    assert "Download" not in result.stdout + result.stderr
    assert not (tmp_path / "empty-hub").exists()  # nothing fetched into the hub cache either


# ---------------------------------------------------------------- in a real browser
def chromium() -> str:
    binary = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if binary:
        return binary
    if os.environ.get("COUNTERAUDIT_REQUIRE_CHROMIUM") == "1":
        pytest.fail("COUNTERAUDIT_REQUIRE_CHROMIUM=1 but chromium is not installed (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install chromium); "
                "COUNTERAUDIT_REQUIRE_CHROMIUM=1 turns this skip into a failure")


def render(html: Path, profile: Path, *flags: str) -> tuple[dict[str, str], str, list[str]]:
    """Open ``html`` in headless Chromium; returns <body>'s attributes after load, the dumped DOM
    and the page's console lines from Chromium's log."""
    result = subprocess.run(
        [chromium(), *flags, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
         "--dump-dom", html.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    body = re.search(r"<body([^>]*)>", result.stdout)
    assert body, f"no <body> in the dumped DOM: {result.stdout[:500]!r}"
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    return attributes, result.stdout, console


@pytest.mark.browser
def test_report_renders_in_chromium_with_every_image_and_no_errors(report, tmp_path):
    path, _ = report
    attributes, dom, console = render(path, tmp_path / "profile")
    count = path.read_text().count("<img ")
    assert count == EXPECTED_IMAGES
    assert attributes.get("data-images-loaded") == f"{count}/{count}", attributes
    assert attributes.get("data-errors") == "0", attributes
    assert attributes.get("data-clipped-labels") == "0", attributes  # every plot label fits
    assert not console, console
    assert "Table 1" in dom and "<svg" in dom


# Two screens a reader opens the report on: a laptop's and a phone's (CSS pixels).
SCREENS = {"laptop": (1366, 768), "phone": (390, 844)}


@pytest.mark.browser
def test_the_summary_is_on_the_first_screen_of_a_laptop_and_a_phone(report, tmp_path):
    """Headless Chromium's own window is at least 500 px wide, so each screen is an iframe of
    its size (the report's script measures inside it; the page copies what it recorded)."""
    path, _ = report
    frames = "".join(f'<iframe id="{name}" src="{path.resolve().as_uri()}" width="{w}" height="{h}">'
                     "</iframe>" for name, (w, h) in SCREENS.items())
    wrapper = tmp_path / "screens.html"
    wrapper.write_text(
        f"<!DOCTYPE html><html><body>{frames}<script>"
        "window.addEventListener('load', function () {"
        " document.querySelectorAll('iframe').forEach(function (frame) {"
        "  var inner = frame.contentDocument.body;"
        "  for (var i = 0; i < inner.attributes.length; i++) {"
        "   document.body.setAttribute('data-' + frame.id + '-' + inner.attributes[i].name.slice(5),"
        "                              inner.attributes[i].value); } }); });"
        "</script></body></html>")
    attributes, _, _ = render(wrapper, tmp_path / "profile", "--allow-file-access-from-files")
    for name, (width, height) in SCREENS.items():
        seen = {k[len(name) + 6:]: v for k, v in attributes.items() if k.startswith(f"data-{name}-")}
        assert seen.get("viewport") == f"{width}x{height}", (name, seen)
        assert seen.get("page-overflow") == "false", (name, seen)  # wide tables scroll alone
        assert seen.get("summary-overflow") == "false", (name, seen)
        assert int(seen["summary-top"]) < height / 4, (name, seen)  # it leads the first screen
        assert seen.get("clipped-labels") == "0", (name, seen)
    # and a screenshot of the phone's first screen shows the summary's panel near its top
    shot = tmp_path / "phone.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=390,844",
                    f"--screenshot={shot}", path.resolve().as_uri()],
                   capture_output=True, timeout=120, check=True)
    picture = Image.open(shot).convert("RGB")
    assert picture.size == (390, 844)
    panel = (0xF7, 0xF9, 0xFB)  # #summary's background
    top_rows = [picture.getpixel((x, y)) for y in range(0, 844 // 4) for x in range(0, 390, 5)]
    assert top_rows.count(panel) > 100


@pytest.mark.browser
def test_browser_check_catches_a_broken_image_and_script_errors(report, tmp_path):
    """The checks above are not vacuous: a copy with one undecodable image, a thrown error, a
    console.error call and a plot label past its plot's edge is reported as such."""
    path, _ = report
    html = path.read_text()
    first = DATA_URI.search(html)
    broken = (html[:first.start(1)] + "AAAA" + html[first.end(1):]).replace(
        "<svg ", '<svg ><text x="-40" y="14">clipped label</text></svg><svg ', 1).replace(
        "</body>", '<script>console.error("planted console error"); throw new Error("planted error");</script></body>')
    broken_path = tmp_path / "broken.html"
    broken_path.write_text(broken)
    attributes, _, console = render(broken_path, tmp_path / "profile")
    count = html.count("<img ")
    assert attributes.get("data-images-loaded") == f"{count - 1}/{count}", attributes
    assert "data-broken-images" in attributes
    assert attributes.get("data-errors") == "2", attributes
    assert attributes.get("data-clipped-labels") == "1", attributes
    assert any("Uncaught" in line and "planted error" in line for line in console), console
    assert any("planted console error" in line for line in console), console
