"""How a built-in run is cut into epochs and steps."""

import pytest

from ringtrain.bench.worker import step_plan


def test_steps_fit_in_one_epoch():
    assert step_plan(10_000, 2, 64, warmup=5, steps=40, epochs=None) == (1, 45, [64] * 45)


def test_steps_span_epochs_of_equal_length_without_short_batches():
    # 1000 items on 2 ranks: 500 each, 7 whole batches of 64 (the short 8th is never used)
    epochs, per_epoch, items = step_plan(1000, 2, 64, warmup=2, steps=20, epochs=None)
    assert epochs == 4
    assert per_epoch == 6
    assert items == [64] * 24
    assert per_epoch <= 7
    assert epochs * per_epoch >= 22


def test_epochs_keep_the_short_last_batch():
    epochs, per_epoch, items = step_plan(1000, 2, 64, warmup=0, steps=None, epochs=2)
    assert (epochs, per_epoch) == (2, None)
    assert items == ([64] * 7 + [52]) * 2  # 500 per rank = 7 x 64 + 52


def test_too_few_items_for_one_batch():
    with pytest.raises(ValueError, match="needs at least 128 items.*HINT"):
        step_plan(100, 2, 64, warmup=0, steps=5, epochs=None)


def test_a_spec_says_how_gradients_travel_and_old_specs_still_do():
    from ringtrain.bench.worker import exchange_method, exchange_settings

    old = exchange_settings({"strategy": "horovod", "fp16_allreduce": True})  # a spec of an earlier sweep
    assert old == {"compression": "fp16", "sync_every": None, "outer_lr": 1.0, "outer_momentum": 0.0}
    assert exchange_settings({"strategy": "ddp"})["compression"] == "none"
    diloco = exchange_settings({"compression": "none", "sync_every": 8, "outer_lr": 0.7,
                                "outer_momentum": 0.9})
    assert exchange_method(diloco).label == "localsgd:8"
    assert exchange_method(exchange_settings({"compression": "powersgd:2"})).label == "powersgd:2"


@pytest.mark.parametrize("name", ["single", "ddp-fp16", "horovod-bf16", "ddp-powersgd4", "horovod-powersgd8",
                                  "horovod-localsgd8", "ddp-diloco4"])
def test_every_strategy_name_makes_a_trainer_config_of_its_method(name):
    """What the plan writes into a spec is what TrainerConfig accepts, and means the same method."""
    from ringtrain.bench.plan import BenchSettings, worker_spec
    from ringtrain.bench.worker import exchange_method, exchange_settings
    from ringtrain.train.config import TrainerConfig

    spec = worker_spec(BenchSettings(workload="mnist", strategies=(name,)), name, 2, threads=1)
    exchange = exchange_settings(spec)
    config = TrainerConfig(strategy=spec["strategy"], **exchange)
    assert config.exchange_method() == exchange_method(exchange)
    assert (config.outer_lr, config.outer_momentum) == (spec["outer_lr"], spec["outer_momentum"])


def test_local_sgd_times_whole_averaging_periods():
    from ringtrain.bench.worker import whole_periods

    assert whole_periods(17, 8) == 16  # equal epochs ran one step more than planned: left out
    assert whole_periods(16, 8) == 16
    assert whole_periods(5, 8) == 5  # under one period: all of it (the report's steps say how few)
    assert whole_periods(17, None) == 17


def test_the_report_carries_the_bytes_each_method_puts_on_the_wire():
    from ringtrain.bench.worker import wire_report
    from ringtrain.exchange import Method, local_sgd, wire_cost

    shapes = [(256, 1024), (256,), (64, 256), (64,)]
    fp32 = 4 * (256 * 1024 + 256 + 64 * 256 + 64)
    assert wire_report(shapes, Method("none"), 2, "horovod") == {
        "wire_bytes_per_step": fp32, "compression_ratio": 1.0, "method": "fp32"}
    assert wire_report(shapes, Method("fp16"), 2, "ddp-fp16")["wire_bytes_per_step"] == fp32 / 2
    powersgd = wire_report(shapes, Method("powersgd", rank=4), 4, "horovod-powersgd4")
    # both matrices as rank-4 factors, the biases as they are: 4 x (4 (256 + 1024) + 256 + 4 (64 + 256) + 64)
    assert powersgd["wire_bytes_per_step"] == 4 * (4 * 1280 + 256 + 4 * 320 + 64)
    assert powersgd["compression_ratio"] == pytest.approx(fp32 / powersgd["wire_bytes_per_step"])
    assert powersgd["method"] == "powersgd:4"
    assert powersgd["wire_bytes_per_step"] == wire_cost(shapes, Method("powersgd", rank=4)).bytes_per_step
    local = wire_report(shapes, local_sgd(8), 2, "horovod-diloco8")
    assert (local["wire_bytes_per_step"], local["compression_ratio"]) == (fp32 / 8, 8.0)
    # no gradient exchanged: one process (the baseline, an independent copy), the barrier's 4 bytes
    assert wire_report(shapes, Method("none"), 1, "single") == {
        "wire_bytes_per_step": 0.0, "compression_ratio": None, "method": None}
    assert wire_report(shapes, Method("none"), 2, "barrier")["wire_bytes_per_step"] == 4.0
