"""Predicted start (placement/core/predict.py): pull from missing bytes over the worker's
measured rate, boot from the app's uncontended history, contention of starts in flight
by the worker's cores."""

from __future__ import annotations

import pytest

from ground.registry.types import WorkerStatus
from placement.core.predict import (
    DEFAULT_BOOT_MS,
    DEFAULT_RESUME_MS,
    BootHistory,
    MachineForecast,
    StartsInFlight,
    WakeForecast,
    contention_stretch,
    forecast_machine,
    start_ms,
    wake_ms,
)

MB = 1_000_000
IMAGE = {"sha256:a": 40 * MB, "sha256:b": 60 * MB}


def worker(wid: str = "w1", *, layers: dict[str, int] | None = None, rate: float = 0.0,
           starting: int = 0, cpus: float = 4) -> WorkerStatus:
    return WorkerStatus(id=wid, epoch=1, region="r", url="http://w", cpus=cpus, memory_mb=4096,
                        layers=layers or {}, pull_bytes_per_s=rate, machines_starting=starting)


def history_of(app: str, boot_ms: float) -> BootHistory:
    history = BootHistory()
    history.observe(app, False, boot_ms)
    return history


def test_a_new_machine_pulls_only_the_bytes_its_worker_lacks_at_its_measured_rate() -> None:
    half = worker(layers={"sha256:a": 40 * MB}, rate=10 * MB)
    m = forecast_machine("new", half, IMAGE, 500.0, 20.0, default_bytes_per_s=100 * MB)
    assert m.pull_ms == pytest.approx(6000.0)  # 60 MB at 10 MB/s
    assert start_ms(m) == pytest.approx(20.0 + 6000.0 + 500.0)


def test_a_worker_that_measured_no_rate_is_predicted_at_the_default() -> None:
    m = forecast_machine("new", worker(), IMAGE, 0.0, 0.0, default_bytes_per_s=100 * MB)
    assert m.pull_ms == pytest.approx(1000.0)


def test_reused_machines_pull_nothing_and_one_already_starting_is_ready_at_once() -> None:
    slow = worker(rate=1.0, starting=9, cpus=1)
    assert forecast_machine("boot", slow, IMAGE, 800.0, 0.0, 1.0).pull_ms == 0.0
    resume = forecast_machine("resume", worker(rate=1.0), IMAGE, 15.0, 5.0, 1.0)
    assert start_ms(resume) == pytest.approx(20.0)
    assert start_ms(forecast_machine("starting", slow, IMAGE, 800.0, 5.0, 1.0)) == 5.0


def test_an_unknown_image_predicts_no_pull() -> None:
    assert forecast_machine("new", worker(rate=1.0), {}, 100.0, 0.0, 1.0).pull_ms == 0.0


def test_starts_stretch_a_boot_only_once_they_outnumber_the_workers_cores() -> None:
    assert [contention_stretch(others, cpus=4) for others in range(6)] == [
        1.0, 1.0, 1.0, 1.0, 1.25, 1.5]
    assert contention_stretch(3, cpus=2) == 2.0  # four CPU-bound boots share two cores
    assert contention_stretch(0, cpus=0.5) == 1.0  # alone, a start is its history


def test_starts_in_flight_by_heartbeat_stretch_a_boot_by_the_workers_cores() -> None:
    roomy = forecast_machine("boot", worker(starting=2, cpus=4), {}, 1000.0, 0.0, 1.0)
    assert start_ms(roomy) == pytest.approx(1000.0)  # three starts, four cores: no wait
    busy = forecast_machine("boot", worker(starting=3, cpus=2), {}, 1000.0, 0.0, 1.0)
    assert start_ms(busy) == pytest.approx(2000.0)


def test_this_placements_starts_in_flight_count_where_the_heartbeat_shows_fewer() -> None:
    stale = worker(starting=0, cpus=2)  # its heartbeat left before the other starts began
    m = forecast_machine("boot", stale, {}, 1000.0, 0.0, 1.0, starting_here=3)
    assert m.stretch == 2.0
    # the heartbeat may count this placement's starts already: the larger, not the sum
    both = forecast_machine("boot", worker(starting=3, cpus=2), {}, 1000.0, 0.0, 1.0,
                            starting_here=3)
    assert both.stretch == 2.0


def test_starts_in_flight_are_counted_per_worker_until_they_end() -> None:
    starts = StartsInFlight()
    starts.began("w1")
    starts.began("w1")
    starts.began("w2")
    starts.ended("w1")
    assert (starts.on("w1"), starts.on("w2"), starts.on("w3")) == (1, 1, 0)
    starts.ended("w1")
    starts.ended("w1")  # one too many: ignored
    starts.ended("w3")
    assert (starts.on("w1"), starts.on("w3")) == (0, 0)


def test_wakes_arriving_together_see_each_others_starts_before_any_heartbeat() -> None:
    workers = {"w1": worker("w1", cpus=2)}  # the heartbeat shows no start
    starts = StartsInFlight()
    predicted = []
    for app in ("a", "b", "c", "d"):
        forecast = WakeForecast(app, 1, workers, history_of(app, 1000.0), 100 * MB,
                                received=0.0)
        predicted.append(forecast.decided(0, "boot", "w1", now=0.0,
                                          starting_here=starts.on("w1")))
        starts.began("w1")  # as the waker counts it, once its worker is decided
    assert predicted == pytest.approx([1000.0, 1000.0, 1500.0, 2000.0])


def test_the_first_of_a_wakes_machines_on_one_worker_is_not_predicted_as_late_as_the_last(
) -> None:
    workers = {"w1": worker("w1", cpus=2)}
    starts = StartsInFlight()
    forecast = WakeForecast("app", 4, workers, history_of("app", 1000.0), 100 * MB,
                            received=0.0)
    for slot in range(4):
        predicted = forecast.decided(slot, "boot", "w1", now=0.05,
                                     starting_here=starts.on("w1"))
        starts.began("w1")
    assert [m.stretch for m in forecast.machines] == [1.0, 1.0, 1.5, 2.0]
    assert predicted == pytest.approx(50.0 + 1000.0)  # the first, not 50 + 2000


def test_a_wake_is_predicted_by_its_earliest_machine() -> None:
    a = forecast_machine("boot", worker("w1"), {}, 1000.0, 0.0, 1.0)
    b = forecast_machine("boot", worker("w1", cpus=1), {}, 1000.0, 0.0, 1.0, starting_here=1)
    c = forecast_machine("new", worker("w2", rate=1 * MB), {"sha256:a": 1 * MB}, 1000.0, 0.0,
                         1.0)
    assert wake_ms([b]) == pytest.approx(2000.0)
    assert wake_ms([a, b, c]) == pytest.approx(1000.0)  # c: 1 s pull + 1 s boot = 2 s
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


def test_a_deleted_apps_history_is_forgotten_so_a_new_app_of_its_name_starts_afresh() -> None:
    history = history_of("a", 5000.0)
    history.observe("a", True, 40.0)
    history.forget("a")
    assert not history.known("a", False) and not history.known("a", True)
    assert history.estimate("a", resumed=False) == DEFAULT_BOOT_MS


def test_boot_history_keeps_boots_alone_so_contention_is_counted_once() -> None:
    workers = {"w1": worker("w1", cpus=2)}
    history = BootHistory()
    # the fourth of four starts on two cores: predicted twice its boot, and so it was
    fourth = WakeForecast("app", 1, workers, history_of("app", 1000.0), 1.0, received=0.0)
    assert fourth.decided(0, "boot", "w1", now=0.0, starting_here=3) == pytest.approx(2000.0)
    history.observe("app", False, 2000.0, stretch=fourth.machines[0].stretch)
    assert history.estimate("app", resumed=False) == pytest.approx(1000.0)
    again = WakeForecast("app", 1, workers, history, 1.0, received=0.0)
    assert again.decided(0, "boot", "w1", now=0.0, starting_here=3) == pytest.approx(2000.0)
    alone = MachineForecast("w1", "boot", 0.0, 0.0, 1000.0, 1.0)  # not the contended span
    assert again.machine("boot", "w1", now=0.0) == alone


def test_a_wake_forecast_answers_once_when_every_machine_has_reported() -> None:
    history = history_of("app", 3000.0)
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
    assert forecast.machine("new", "gone-worker", now=0.1) is None
    assert forecast.decided(0, "new", "gone-worker", now=0.1) is None
    assert forecast.failed(1) is None
    assert forecast.predicted_ms is None and forecast.measured() == (0.0, 0.0)


def test_an_old_heartbeat_without_a_rate_decodes_with_none_measured() -> None:
    import msgspec

    old = b'{"id":"w1","epoch":1,"region":"r","url":"u","cpus":1,"memory_mb":1}'
    assert msgspec.json.decode(old, type=WorkerStatus).pull_bytes_per_s == 0.0
