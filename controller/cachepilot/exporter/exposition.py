"""The text exposition formats, written from metric families (families.py): Prometheus text 0.0.4 (curl, the
node_exporter textfile) and OpenMetrics 1.0 (what Prometheus asks for), the one a scraper gets chosen from its
``Accept`` header as prometheus_client 0.26 chooses it (``choose_encoder``).

The bytes are prometheus_client's for the same families (``generate_latest`` of either format; compared byte for byte
by tests/unit/test_exposition.py): floats as Go writes them (``1.0``, ``+Inf``, ``NaN``, ``6.5536e+06``), label values
with ``\\``, ``"`` and newlines escaped, labels sorted by name, HELP escaped as each format says. Two deliberate
differences, both for requests Prometheus does not make by default: an ``Accept`` version that is not a dotted
number (prometheus_client raises, and the scrape got no answer) is skipped like an old version; and OpenMetrics with
``escaping=values`` leaves our names as they are, as the escaping scheme says for a legal name (prometheus_client
0.26 writes its sample names ``U__cachepilot__...`` but not its HELP and TYPE lines).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial

from cachepilot.exporter.families import Metric, Sample

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
TEXT_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
UNDERSCORES, DOTS = "underscores", "dots"
ESCAPINGS = ("allow-utf-8", UNDERSCORES, DOTS, "values")

Encoder = Callable[[Iterable[Metric]], bytes]


def go_float(value: float) -> str:
    """A sample's value as Go's strconv writes it (Prometheus' own clients): Go switches to an exponent past 1e21
    where Python does past 1e16, so a positive number with more than six digits before the point gets one."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _name(name: str, escaping: str) -> str:
    """A metric or label name under the scraper's escaping scheme. Our names are legal legacy names without colons
    (families.check_name): allow-utf-8, underscores and values leave them alone; dots doubles every underscore."""
    return name.replace("_", "__") if escaping == DOTS else name


def _escape(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help_text(doc: str) -> str:
    """The text format escapes only backslashes and newlines in HELP; OpenMetrics quotes too (as label values)."""
    return doc.replace("\\", r"\\").replace("\n", r"\n")


def _line(s: Sample, escaping: str) -> str:
    labels = ",".join(f'{_name(k, escaping)}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
    return f"{_name(s.name, escaping)}{{{labels}}} {go_float(s.value)}\n" if labels else \
        f"{_name(s.name, escaping)} {go_float(s.value)}\n"


def text(families: Iterable[Metric], escaping: str = UNDERSCORES) -> bytes:
    """Prometheus text format 0.0.4: a counter's HELP and TYPE name its ``_total`` samples."""
    out = []
    for m in families:
        name = _name(m.name + "_total" if m.type == "counter" else m.name, escaping)
        out.append(f"# HELP {name} {_help_text(m.documentation)}\n# TYPE {name} {m.type}\n")
        out.extend(_line(s, escaping) for s in m.samples)
    return "".join(out).encode()


def openmetrics(families: Iterable[Metric], escaping: str = UNDERSCORES) -> bytes:
    """OpenMetrics 1.0: a counter's HELP and TYPE name its family (without ``_total``); ``# EOF`` ends it."""
    out = []
    for m in families:
        name = _name(m.name, escaping)
        out.append(f"# HELP {name} {_escape(m.documentation)}\n# TYPE {name} {m.type}\n")
        out.extend(_line(s, escaping) for s in m.samples)
    out.append("# EOF\n")
    return "".join(out).encode()


def _param(tokens: list[str], key: str) -> str:
    """The first ``key=value`` of an Accept entry's parameters, as prometheus_client reads them (no quotes, no
    spaces around ``=``); "" without one."""
    for tok in tokens:
        if "=" in tok:
            k, value = tok.strip().split("=", 1)
            if k == key:
                return value
    return ""


def _at_least_1(version: str) -> bool:
    parts: list[int | str] = []
    for part in version.split("."):
        try:
            parts.append(int(part))
        except ValueError:
            parts.append(part)
    try:
        return tuple(parts) >= (1, 0, 0)
    except TypeError:  # e.g. "1.x": prometheus_client raises here; we skip the entry as an old version
        return False


def negotiate(accept: str) -> tuple[Encoder, str]:
    """The encoder and Content-Type for a scraper's ``Accept`` header: its first entry we serve, in its order
    (quality values are not weighed, as prometheus_client does not): OpenMetrics without a version or at 1.0 or
    later, text at 1.0 or later; else text 0.0.4 (curl, and Prometheus 2 when it asks for text)."""
    for entry in (accept or "").split(","):
        tokens = entry.split(";")
        media, version = tokens[0].strip(), _param(tokens, "version")
        escaping = _param(tokens, "escaping")
        escaping = escaping if escaping in ESCAPINGS else UNDERSCORES
        if media == "application/openmetrics-text":
            if not version:
                return openmetrics, OPENMETRICS
            if _at_least_1(version):
                return (partial(openmetrics, escaping=escaping),
                        f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}")
        elif media == "text/plain" and version and _at_least_1(version):
            return partial(text, escaping=escaping), f"{TEXT_1_0_0}; escaping={escaping}"
    return text, TEXT_0_0_4
