"""Read an exporter's /metrics into a flat mapping (for assertions in any suite)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

SeriesId = tuple[str, frozenset[tuple[str, str]]]


def parse_exposition(text: str) -> dict[SeriesId, float]:
    """{(sample name, frozenset(labels)): value} of a text exposition (fails on duplicates)."""
    out: dict[SeriesId, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def fetch_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def scrape(url: str) -> dict[SeriesId, float]:
    return parse_exposition(fetch_text(url))


def select(series: dict[SeriesId, float], name: str, **labels: str) -> dict[SeriesId, float]:
    """The series named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {k: v for k, v in series.items() if k[0] == name and want <= k[1]}
