"""The one table: rows of contenders and figures, printed as text, Markdown or JSON."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

PASS = "pass"
FAIL = "FAIL"
NA = "n/a"

DISCLAIMER = (
    "Figures are from one run on a shared machine, all contenders side by side in "
    "interleaved rounds (medians). Absolute numbers vary up to 2x between runs: "
    "read the ratios, not the absolute figures."
)


@dataclass
class Row:
    section: str
    contender: str
    figure: str
    value: float | None  # the raw number (None: not measured)
    shown: str  # the number as printed, or "n/a (why)" / "error: ..."
    ratio: str = ""
    bar: str = ""
    verdict: str = ""  # PASS, FAIL, NA or "" (no bar)
    extra: dict[str, Any] = field(default_factory=dict)  # JSON-only details


def verdict(ok: bool | None) -> str:
    if ok is None:
        return NA
    return PASS if ok else FAIL


def rate(value: float) -> str:
    return f"{value:,.0f}"


def ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    value = seconds * 1000
    if value >= 100:
        return f"{value:,.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def times(value: float, of: str) -> str:
    if math.isnan(value) or math.isinf(value):
        return ""
    return f"{value:.2f}x {of}"


@dataclass
class Report:
    meta: dict[str, str]
    sections: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> None:
        if row.section not in self.sections:
            self.sections.append(row.section)
        self.rows.append(row)

    def add_all(self, rows: list[Row]) -> None:
        for row in rows:
            self.add(row)

    # -- summary ------------------------------------------------------------------------

    def tally(self) -> dict[str, int]:
        counts = {PASS: 0, FAIL: 0, NA: 0}
        for row in self.rows:
            if row.verdict in counts:
                counts[row.verdict] += 1
        return counts

    def header_lines(self) -> list[str]:
        m = self.meta
        return [
            f"redlease benchmarks, {m['date']} ({m['mode']} run)",
            f"server: {m['server']} (private, loopback) | machine: {m['cores']} cores, "
            f"{m['platform']} | Python {m['python']} | redis-py {m['redis_py']}",
            DISCLAIMER,
        ]

    def summary_line(self) -> str:
        t = self.tally()
        return f"bars: {t[PASS]} pass, {t[FAIL]} fail, {t[NA]} not measurable here (n/a)"

    # -- renderings ---------------------------------------------------------------------

    def _cells(self, section: str) -> list[list[str]]:
        cells = []
        previous = None
        for row in self.rows:
            if row.section != section:
                continue
            name = "" if row.contender == previous else row.contender
            previous = row.contender
            cells.append([name, row.figure, row.shown, row.ratio, row.bar, row.verdict])
        return cells

    def text(self) -> str:
        titles = ["contender", "figure", "value", "ratio", "bar", "verdict"]
        every = [titles] + [c for s in self.sections for c in self._cells(s)]
        widths = [max(len(c[i]) for c in every) for i in range(len(titles))]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        total = sum(widths) + 2 * (len(widths) - 1)
        out = [*self.header_lines(), "", line(titles), "=" * total]
        for section in self.sections:
            out.append(f"-- {section} ".ljust(total, "-"))
            out.extend(line(c) for c in self._cells(section))
        out.append("=" * total)
        out.append(self.summary_line())
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)

    def markdown(self) -> str:
        m = self.meta
        out = [
            f"Measured {m['date']} ({m['mode']} run) on {m['server']}, a private server on "
            f"loopback; {m['cores']} cores, {m['platform']}; Python {m['python']}, "
            f"redis-py {m['redis_py']}. Command: `{m['command']}`.",
            "",
            DISCLAIMER,
            "",
            "| contender | figure | value | ratio | bar | verdict |",
            "|---|---|---:|---:|---|---|",
        ]
        for section in self.sections:
            out.append(f"| **{section}** | | | | | |")
            for cells in self._cells(section):
                escaped = [c.replace("|", "\\|") for c in cells]
                out.append("| " + " | ".join(escaped) + " |")
        out.append("")
        out.append(self.summary_line() + ".")
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "disclaimer": DISCLAIMER,
            "rows": [asdict(r) for r in self.rows],
            "notes": self.notes,
            "tally": self.tally(),
        }
