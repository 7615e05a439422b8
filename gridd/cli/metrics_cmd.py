"""``gridctl metrics``: the daemon's Prometheus metrics, printed for a person (or raw).

The text comes from ``GET /metrics`` and is parsed with ``prometheus_client.parser``, the
same parser a scraper's tests would use. Histograms are summarised (count, mean, and the
bucket that holds the median); ``--raw`` prints the exposition text unchanged.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gridd.cli.context import EXIT_OK, Command, Context


def build_metrics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--raw", action="store_true", help="print the Prometheus text exposition unchanged"
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="include the process_* metrics and series whose value is zero",
    )
    parser.add_argument(
        "match",
        nargs="?",
        default=None,
        metavar="TEXT",
        help="only metrics whose name contains TEXT (e.g. 'merge', 'tasks')",
    )


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _labels(sample: Sample, skip: Iterable[str] = ()) -> str:
    pairs = [f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in skip]
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _histogram_lines(name: str, samples: list[Sample]) -> list[str]:
    """One line per label set: count, mean and the median's bucket."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(_labels(sample, skip=("le",)), []).append(sample)
    lines = []
    for labels, group in groups.items():
        count = next((s.value for s in group if s.name.endswith("_count")), 0.0)
        total = next((s.value for s in group if s.name.endswith("_sum")), 0.0)
        if not count:
            lines.append(f"  {name}{labels}  no observations")
            continue
        buckets = sorted(
            ((float(s.labels["le"]), s.value) for s in group if s.name.endswith("_bucket")),
        )
        median = next((le for le, n in buckets if n >= count / 2), math.inf)
        lines.append(
            f"  {name}{labels}  count {_number(count)}, mean {total / count:.4g} s,"
            f" median <= {_number(median)} s"
        )
    return lines


def readable(text: str, *, match: str | None = None, everything: bool = False) -> str:
    """The exposition as a short report: a heading per family, then its series."""
    out: list[str] = []
    for family in text_string_to_metric_families(text):
        if match and match not in family.name:
            continue
        if not everything and family.name.startswith(("process_", "python_")):
            continue
        if family.type == "histogram":
            lines = _histogram_lines(family.name, family.samples)
        else:
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            shown = samples
            if not everything and len(samples) > 1:
                shown = [s for s in samples if s.value != 0]
            lines = [f"  {s.name}{_labels(s)}  {_number(s.value)}" for s in shown]
            if samples and not lines:
                lines = [f"  {samples[0].name}{{...}}  0 (every series)"]
        if not lines:
            continue
        out.append(f"{family.name} ({family.type}): {family.documentation}")
        out += lines
    return "\n".join(out)


def run_metrics(ctx: Context) -> int:
    text = ctx.client().get_text("/metrics")
    if ctx.args.raw:
        print(text, end="")
    else:
        print(readable(text, match=ctx.args.match, everything=ctx.args.all))
    return EXIT_OK


METRICS = Command(
    help="print the daemon's Prometheus metrics readably (--raw: the exposition text)",
    description="Fetch GET /metrics and print each metric family with its help text and"
    " values: tasks by status, agents and the limit, spawns and exits, latencies, questions,"
    " spend and budget, the event log, SSE clients, the merge queue, request latency and the"
    " background parts. Series at zero are left out unless --all. See docs/operations.md.",
    build=build_metrics,
    run=run_metrics,
)
