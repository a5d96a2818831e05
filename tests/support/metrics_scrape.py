"""Scraping a worker's Prometheus endpoint, for the metrics tests: its samples, read."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client.parser import text_string_to_metric_families

from worker_cli.observe.prometheus import MetricsServer, serve_metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

JOBS = "graphile_worker._private_jobs"


def scrape(url: str) -> Samples:
    """Every sample of ``/metrics``, by name and labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@asynccontextmanager
async def served() -> AsyncIterator[MetricsServer]:
    server = serve_metrics(0)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.close)


async def scrape_async(url: str) -> Samples:
    # From another thread, as Prometheus would: the depth query runs on the loop.
    return await asyncio.to_thread(scrape, url)
