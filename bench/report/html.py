"""``report.html``: one self-contained page (figures embedded as base64 PNG, CSS and the one script inline).

Nothing is fetched: a Content-Security-Policy forbids every network source, and allows only this page's own
script (by hash) and inline styles. Every string comes through jinja2 with autoescape on, so a name taken from a
record (a workload called ``<script>alert(1)</script>``) shows as text. The page is responsive: wide tables scroll
inside their own box, figures shrink to the screen.
"""

from __future__ import annotations

import base64
import hashlib

import jinja2
from markupsafe import Markup

from bench.report.document import Report

# Sets data-figures="ok" on <html> once every image has decoded (naturalWidth > 0), "broken" otherwise; the HTML
# test reads it back from the rendered DOM.
CHECK_SCRIPT = """(function () {
  function check() {
    var imgs = Array.prototype.slice.call(document.images);
    var ok = imgs.every(function (i) { return i.complete && i.naturalWidth > 0; });
    document.documentElement.setAttribute("data-figure-count", String(imgs.length));
    document.documentElement.setAttribute("data-figures", ok ? "ok" : "broken");
  }
  if (document.readyState === "complete") { check(); } else { window.addEventListener("load", check); }
})();"""

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("bench.report", "templates"),
    autoescape=True,  # every file, whatever its extension
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(CHECK_SCRIPT.encode()).digest()).decode()
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


def render(report: Report) -> str:
    images = {name: base64.b64encode(fig.png).decode("ascii") for name, fig in report.figures.items()}
    template = _ENV.get_template("report.html.j2")
    return template.render(r=report, images=images, script=Markup(CHECK_SCRIPT), csp=_csp())
