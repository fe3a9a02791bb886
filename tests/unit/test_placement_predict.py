"""Predicted start (placement/core/predict.py): pull from missing bytes over the worker's
measured rate, boot from the app's history, contention of starts in flight."""

from __future__ import annotations

import pytest

from imagecache.stats import MIN_RATED_BYTES, PullStats
from placement.core.predict import (
    CONTENTION_PER_START,
    DEFAULT_BOOT_MS,
    DEFAULT_RESUME_MS,
    BootHistory,
    WakeForecast,
    forecast_machine,
    start_ms,
    wake_ms,
)
from thaw.registry.types import WorkerStatus

MB = 1_000_000
IMAGE = {"sha256:a": 40 * MB, "sha256:b": 60 * MB}


def worker(wid: str = "w1", *, layers: dict[str, int] | None = None, rate: float = 0.0,
           starting: int = 0) -> WorkerStatus:
    return WorkerStatus(id=wid, epoch=1, region="r", url="http://w", cpus=4, memory_mb=4096,
                        layers=layers or {}, pull_bytes_per_s=rate, machines_starting=starting)


def test_a_new_machine_pulls_only_the_bytes_its_worker_lacks_at_its_measured_rate() -> None:
    half = worker(layers={"sha256:a": 40 * MB}, rate=10 * MB)
    m = forecast_machine("new", half, IMAGE, 500.0, 20.0, default_bytes_per_s=100 * MB)
    assert m.pull_ms == pytest.approx(6000.0)  # 60 MB at 10 MB/s
    assert start_ms(m, 0) == pytest.approx(20.0 + 6000.0 + 500.0)


def test_a_worker_that_measured_no_rate_is_predicted_at_the_default() -> None:
    m = forecast_machine("new", worker(), IMAGE, 0.0, 0.0, default_bytes_per_s=100 * MB)
    assert m.pull_ms == pytest.approx(1000.0)


def test_reused_machines_pull_nothing_and_one_already_starting_is_ready_at_once() -> None:
    slow = worker(rate=1.0)
    assert forecast_machine("boot", slow, IMAGE, 800.0, 0.0, 1.0).pull_ms == 0.0
    resume = forecast_machine("resume", slow, IMAGE, 15.0, 5.0, 1.0)
    assert start_ms(resume, 0) == pytest.approx(20.0)
    assert start_ms(forecast_machine("starting", slow, IMAGE, 800.0, 5.0, 1.0), 0) == 5.0


def test_an_unknown_image_predicts_no_pull() -> None:
    assert forecast_machine("new", worker(rate=1.0), {}, 100.0, 0.0, 1.0).pull_ms == 0.0


def test_each_start_in_flight_on_the_worker_stretches_the_boot_linearly() -> None:
    busy = forecast_machine("boot", worker(starting=2), {}, 1000.0, 0.0, 1.0)
    assert start_ms(busy, 0) == pytest.approx(1000.0 * (1 + 2 * CONTENTION_PER_START))
    assert start_ms(busy, 1) == pytest.approx(1000.0 * (1 + 3 * CONTENTION_PER_START))


def test_a_wake_is_predicted_by_its_earliest_machine_counting_its_own_siblings() -> None:
    a = forecast_machine("boot", worker("w1"), {}, 1000.0, 0.0, 1.0)
    b = forecast_machine("boot", worker("w1"), {}, 1000.0, 0.0, 1.0)
    c = forecast_machine("new", worker("w2", rate=1 * MB), {"sha256:a": 1 * MB}, 1000.0, 0.0,
                         1.0)
    assert wake_ms([a, b]) == pytest.approx(1000.0 * (1 + CONTENTION_PER_START))
    assert wake_ms([a, b, c]) == pytest.approx(1500.0)  # c: 1 s pull + 1 s boot = 2 s
    assert wake_ms([]) is None


def test_boot_history_is_an_ewma_per_app_with_resumes_apart_and_defaults_before_any() -> None:
    history = BootHistory(weight=0.5)
    assert history.estimate("a", resumed=False) == DEFAULT_BOOT_MS
    assert history.estimate("a", resumed=True) == DEFAULT_RESUME_MS
    history.observe("a", False, 2000.0)
    assert history.estimate("a", resumed=False) == 2000.0
    history.observe("a", False, 1000.0)
    history.observe("a", False, 0.0)  # no span: says nothing
    assert history.estimate("a", resumed=False) == 1500.0
    assert history.estimate("a", resumed=True) == DEFAULT_RESUME_MS
    assert history.estimate("b", resumed=False) == DEFAULT_BOOT_MS
    history.forget("a")
    assert not history.known("a", False)


def test_a_wake_forecast_answers_once_when_every_machine_has_reported() -> None:
    history = BootHistory()
    history.observe("app", False, 3000.0)
    workers = {"w1": worker("w1"), "w2": worker("w2")}
    forecast = WakeForecast("app", 3, workers, history, 100 * MB, received=10.0)
    assert forecast.decided(0, "boot", "w1", now=10.1) is None
    assert forecast.failed(1) is None
    predicted = forecast.decided(2, "boot", "w2", now=10.2)
    assert predicted == pytest.approx(100.0 + 3000.0)  # w1's: decided 100 ms in, 3 s boot
    assert forecast.decided(2, "boot", "w2", now=11.0) is None  # a slot reports once
    assert forecast.decided(7, "boot", "w2", now=11.0) is None  # no such slot
    forecast.ready(13.5)
    forecast.ready(14.0)
    assert forecast.measured() == (3100.0, 3500.0)


def test_a_wake_whose_machines_all_failed_before_placement_predicts_nothing() -> None:
    forecast = WakeForecast("app", 2, {}, BootHistory(), 1.0, received=0.0)
    assert forecast.decided(0, "new", "gone-worker", now=0.1) is None
    assert forecast.failed(1) is None
    assert forecast.predicted_ms is None and forecast.measured() == (0.0, 0.0)


def test_the_cache_rates_big_downloads_as_an_ewma_and_ignores_small_ones() -> None:
    stats = PullStats()
    stats.downloaded(100, 0.5)  # too small to say anything about bandwidth
    assert stats.bytes_per_s == 0.0 and stats.bytes_downloaded == 100
    stats.downloaded(10 * MB, 1.0)
    assert stats.bytes_per_s == 10 * MB
    stats.downloaded(MIN_RATED_BYTES, MIN_RATED_BYTES / (20 * MB))
    assert stats.bytes_per_s == pytest.approx(13 * MB)  # 10 + 0.3 * (20 - 10)
    assert stats.layers_downloaded == 3


def test_an_old_heartbeat_without_a_rate_decodes_with_none_measured() -> None:
    import msgspec

    old = b'{"id":"w1","epoch":1,"region":"r","url":"u","cpus":1,"memory_mb":1}'
    assert msgspec.json.decode(old, type=WorkerStatus).pull_bytes_per_s == 0.0
