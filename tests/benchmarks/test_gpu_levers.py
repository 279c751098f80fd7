"""benchmarks/gpu_levers.py's pure parts: the steady ms/step from timestamped progress events, the
budget, the rows' configs (each lever row one switch away from its reference, every config
accepted by the project's loader), best's choice of levers, the event tap and the section."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import gpu_levers as gl

MICRO = 256


@pytest.fixture
def rows() -> dict[str, gl.Row]:
    return {row.name: row for row in gl.plan(MICRO, tiny=False)}


# -- the steady ms/step --------------------------------------------------------------------------


def test_steady_ms_per_step_is_the_time_between_the_first_sync_after_the_warm_up_and_the_last():
    # Syncs at steps 10..40 arriving at these seconds; steps 1-10 (warm-up) took 5 s.
    progress = [(5.0, 10), (6.0, 20), (7.2, 30), (8.2, 40)]
    found = gl.steady(progress, warmup=10)
    assert found is not None
    assert found["ms_per_step"] == pytest.approx(1000 * 3.2 / 30)
    assert (found["from_step"], found["to_step"], found["syncs"]) == (10, 40, 4)
    assert found["median_interval_ms"] == pytest.approx(100.0)
    assert found["max_interval_ms"] == pytest.approx(120.0)


def test_steady_leaves_out_syncs_before_the_warm_up_and_reads_uneven_strides():
    # A compiled row: the first sync (step 10) is inside the warm-up; then the stride shrinks to 2.
    progress = [(30.0, 10), (31.0, 20), (31.3, 22), (31.6, 24)]
    found = gl.steady(progress, warmup=20)
    assert found is not None
    assert found["ms_per_step"] == pytest.approx(1000 * 0.6 / 4)
    assert found["from_step"] == 20
    assert found["median_interval_ms"] == pytest.approx(150.0)


def test_steady_orders_by_step_whatever_order_the_lines_came_in():
    assert gl.steady([(2.0, 20), (1.0, 10)], warmup=10)["ms_per_step"] == pytest.approx(100.0)


@pytest.mark.parametrize("progress", [[], [(1.0, 10)], [(1.0, 10), (2.0, 20)]])
def test_steady_needs_two_syncs_after_the_warm_up(progress):
    assert gl.steady(progress, warmup=15) is None


# -- the budget ----------------------------------------------------------------------------------


def test_a_row_that_would_end_past_the_budget_is_not_started():
    assert gl.budget_reason(elapsed=380, estimate=50, budget_s=420) is not None
    assert "380 s used of 420" in gl.budget_reason(380, 50, 420)
    assert gl.budget_reason(elapsed=360, estimate=50, budget_s=420) is None


def test_the_estimate_is_the_mean_of_the_kind_without_the_first_job_and_compiling_adds_its_prior(rows):
    priors = {"job": 55.0, "compile": 60.0, "hf": 45.0, "bare": 60.0, "ops": 45.0}
    assert gl.estimate_s(rows["fused"], False, {}, priors) == 55.0
    walls = {"job": [90.0, 40.0, 50.0]}  # the first job paid the first-time costs
    assert gl.estimate_s(rows["fused"], False, walls, priors) == 45.0
    assert gl.estimate_s(rows["best"], True, walls, priors) == 105.0  # best is a job
    assert gl.estimate_s(rows["hf"], False, walls, priors) == 45.0
    assert gl.estimate_s(rows["baseline"], False, {"job": [90.0]}, priors) == 90.0


# -- the rows and their configs ------------------------------------------------------------------


def test_the_device_and_tiny_plans_hold_the_same_rows_once_each_baseline_first(rows):
    device, tiny = gl.plan(MICRO, tiny=False), gl.plan(16, tiny=True)
    assert device[0].name == tiny[0].name == "baseline"
    assert sorted(r.name for r in device) == sorted(r.name for r in tiny)
    assert len(rows) == len(device)
    names = [r.name for r in device]
    # A row runs after the rows it is compared with.
    for row in device:
        if row.reference is not None:
            assert names.index(row.reference) < names.index(row.name), row.name


def test_each_lever_row_differs_from_its_reference_in_exactly_its_switch(rows):
    for name, row in rows.items():
        if row.kind != "job" or row.reference is None:
            continue
        mine = gl.settings_of(row, rows, MICRO)
        theirs = gl.settings_of(rows[row.reference], rows, MICRO)
        changed = gl.differences(theirs, mine)
        if name == "accum":  # the layout is one switch: the same global batch cut otherwise
            assert set(changed) == set(gl.LAYOUT_KEYS)
            assert mine["batch_size"] * mine["gradient_accumulation_steps"] == theirs["batch_size"]
        else:
            assert list(changed) == list(row.switch), name
            assert len(changed) == 1, name


def test_the_baseline_has_every_lever_off(rows):
    baseline = gl.settings_of(rows["baseline"], rows, MICRO)
    assert baseline == {
        "optimizer": "foreach", "attention": "sdpa", "compile": "none", "fused_qkv": False, "immediate_grad_update": False,
        "group_by_length": False, "packing": False, "data_on_device": False, "zero_stage": 1, "batch_size": 256,
        "gradient_accumulation_steps": 1,
    }  # fmt: skip
    assert gl.settings_of(rows["baseline_4x"], rows, MICRO)["batch_size"] == 1024
    assert gl.settings_of(rows["group"], rows, MICRO)["group_by_length"] is True


def _parsed(tmp_path, settings, gpu):
    base = gl.base_config(tmp_path / "encoder", gpu)
    text = gl.row_config(base, settings, max_steps=50)
    return text, parse_config(text)


def test_every_job_row_config_passes_the_loader_on_a_gpu_node_and_says_what_the_row_asks(tmp_path, rows):
    for name, row in rows.items():
        if row.kind != "job":
            continue
        settings = gl.settings_of(row, rows, MICRO)
        _, config = _parsed(tmp_path, settings, gpu=True)
        training = config.training
        assert training.speed.model_dump() == {k: settings[k] for k in gl.SPEED_KEYS}, name
        assert training.deepspeed.zero_stage == settings["zero_stage"]
        assert training.hyperparameters.batch_size == settings["batch_size"]
        assert training.hyperparameters.gradient_accumulation_steps == settings["gradient_accumulation_steps"]
        assert training.hyperparameters.max_steps == 50
        assert training.resources.gpus_per_node == 1
        assert training.checkpoint.every_steps > 50  # no save inside the loop
        assert config.data.features.text == ["subject", "body"] and not config.data.features.numeric


def test_on_cpu_the_rows_the_loader_refuses_are_the_ones_skipped_as_gpu_only(tmp_path, rows):
    skipped = set()
    for name, row in rows.items():
        if row.kind != "job":
            continue
        settings = gl.settings_of(row, rows, MICRO)
        reason = gl.skip_reason(settings, gpu=False)
        if reason is None:
            _parsed(tmp_path, settings, gpu=False)
        else:
            skipped.add(name)
            assert reason.startswith("GPU only")
            with pytest.raises(ConfigError):
                _parsed(tmp_path, settings, gpu=False)
    assert skipped == {"device_rows", "cudagraphs", "flash"}


def test_flash_attention_is_skipped_on_a_gpu_without_the_package(rows, monkeypatch):
    monkeypatch.setattr(gl.importlib.util, "find_spec", lambda name: None)
    flash = gl.settings_of(rows["flash"], rows, MICRO)
    assert "flash-attn" in gl.skip_reason(flash, gpu=True)
    assert gl.skip_reason(gl.settings_of(rows["fused"], rows, MICRO), gpu=True) is None


def test_compiled_rows_warm_up_longer_and_large_batches_take_fewer_steps():
    base = gl.baseline_settings(MICRO)
    assert gl.steps_for(base, MICRO, tiny=False) == (50, 10)
    assert gl.steps_for({**base, "compile": "default"}, MICRO, tiny=False) == (60, 20)
    assert gl.steps_for({**base, "batch_size": 1024}, MICRO, tiny=False) == (30, 10)
    assert gl.steps_for({**base, "gradient_accumulation_steps": 4}, MICRO, tiny=False) == (30, 10)
    assert gl.steps_for(gl.baseline_settings(16), 16, tiny=True) == (30, 10)


# -- best ----------------------------------------------------------------------------------------


def test_best_takes_each_lever_that_gained_and_of_exclusive_ones_the_larger(tmp_path):
    gains = {"fused": 1.10, "compile": 1.05, "cudagraphs": 1.20, "immediate": 1.03, "zero2": 1.08,
             "eager": 0.90, "device_rows": 1.01}  # fmt: skip
    settings, chosen = gl.best_settings(gains, MICRO, scale=1)
    assert chosen == ["fused", "cudagraphs", "zero2"]
    assert settings["optimizer"] == "fused" and settings["compile"] == "reduce-overhead"
    assert settings["zero_stage"] == 2 and settings["immediate_grad_update"] is False
    assert settings["attention"] == "sdpa" and settings["data_on_device"] is False  # 1% is noise
    _parsed(tmp_path, settings, gpu=True)  # immediate with ZeRO-2 would be refused


def test_best_without_any_gain_is_the_baseline():
    settings, chosen = gl.best_settings({"fused": 1.0, "zero2": 0.97}, MICRO, scale=1)
    assert chosen == [] and settings == gl.baseline_settings(MICRO)


def test_best_at_four_times_the_batch_takes_the_layout_and_grouping_only_when_they_gained(tmp_path):
    settings, chosen = gl.best_settings({"immediate": 1.05, "accum": 1.04, "group": 1.03}, MICRO, scale=4)
    assert (settings["batch_size"], settings["gradient_accumulation_steps"]) == (256, 4)
    assert settings["group_by_length"] is True and chosen == ["immediate", "accum", "group"]
    _parsed(tmp_path, settings, gpu=True)
    settings, chosen = gl.best_settings({"accum": 0.9, "group": 1.2}, MICRO, scale=4)
    assert (settings["batch_size"], settings["gradient_accumulation_steps"]) == (1024, 1)
    assert settings["group_by_length"] is False and chosen == []
    _parsed(tmp_path, settings, gpu=True)  # grouping one micro-batch would be refused


def test_a_lever_the_start_event_shows_not_in_force_is_named_and_gains_nothing(rows):
    settings = gl.settings_of(rows["immediate"], rows, MICRO)
    speed = {"fused_optimizer": False, "attention": "sdpa", "compiled": False, "immediate_grad_update": False,
             "group_by_length": False, "data_on_device": False}  # fmt: skip
    assert gl.not_in_force(settings, speed) == ["immediate_grad_update"]
    assert gl.not_in_force(settings, {**speed, "immediate_grad_update": True}) == []
    assert gl.not_in_force(settings, None) == []
    fused = gl.settings_of(rows["fused"], rows, MICRO)
    assert gl.not_in_force(fused, speed) == ["optimizer"]
    compiled = gl.settings_of(rows["compile"], rows, MICRO)
    assert gl.not_in_force(compiled, {**speed, "compiled": True}) == []
    run = gl.Run(None, None, {}, False, MICRO, {}, [], 0.0, {})
    run.found.update(
        baseline={"samples_per_s": 100.0},
        immediate={"samples_per_s": 150.0, "not_in_force": ["immediate_grad_update"]},
        fused={"samples_per_s": 120.0, "not_in_force": []},
        zero2={"failed": "exit code 1"},
    )
    assert run.gains(rows) == {"fused": pytest.approx(1.2)}


def test_gains_are_throughput_ratios_to_the_reference():
    found = {
        "baseline": {"samples_per_s": 2000.0},
        "fused": {"samples_per_s": 2500.0},
        "bad": {"failed": "x"},
    }
    assert gl.gain(found, "fused", "baseline") == pytest.approx(1.25)
    assert gl.gain(found, "bad", "baseline") is None
    assert gl.gain(found, "baseline", None) is None


# -- the event tap -------------------------------------------------------------------------------


def test_the_tap_prints_event_lines_raw_and_leaves_the_cli_its_sentences(monkeypatch, capsys):
    from airflow_trainpipe.launchers import watcher

    monkeypatch.setattr(watcher.JobWatcher, "feed", watcher.JobWatcher.feed)  # restored after the test
    gl.tap_events()
    line = "TRAINPIPE " + json.dumps(
        {
            "event": "progress",
            "step": 20,
            "total_steps": 50,
            "epoch": 0,
            "loss": 1.2,
            "samples_per_s": 9.0,
            "eta_s": 3.0,
        }
    )
    shown = watcher.JobWatcher(show_raw=False).feed(line)
    assert shown is not None and shown.startswith("step 20/50")
    assert capsys.readouterr().out.strip() == line
    assert watcher.JobWatcher(show_raw=False).feed("plain text") is None
    assert capsys.readouterr().out == ""


# -- the section ---------------------------------------------------------------------------------


def _found(rows):
    settings = gl.settings_of(rows["baseline"], rows, MICRO)
    job = {
        "kind": "job", "reference": None, "changed": rows["baseline"].changed, "settings": settings,
        "speed": {"fused_optimizer": False, "attention": "sdpa", "compiled": False, "immediate_grad_update": False,
                  "group_by_length": False, "data_on_device": False},
        "dtype": "bfloat16", "global_batch": 256, "ms_per_step": 128.0, "median_interval_ms": 127.0, "result_ms_per_step": 150.0,
        "samples_per_s": 2000.0, "startup_s": 30.0, "end_s": 14.0, "macro_f1": 0.31, "new_token_cache_folders": 0,
    }  # fmt: skip
    fused = {**job, "reference": "baseline", "changed": rows["fused"].changed, "samples_per_s": 2500.0,
             "ms_per_step": 102.4, "speed": {**job["speed"], "fused_optimizer": True}}  # fmt: skip
    best = {
        **fused,
        "kind": "best",
        "changed": rows["best"].changed,
        "chosen": ["fused"],
        "unmeasured": ["compile"],
    }
    immediate = {
        **job,
        "reference": "baseline",
        "changed": rows["immediate"].changed,
        "samples_per_s": 2100.0,
        "settings": {**settings, "immediate_grad_update": True},
        "not_in_force": ["immediate_grad_update"],
    }
    return {
        "when": "2026-11-28 12:00 UTC", "device": "NVIDIA H100 80GB HBM3", "cores": 16, "versions": "torch 2.11",
        "wall_s": 400.0, "shape": gl.ENCODER_100M, "rows_total": 50_000, "dtype": "bfloat16", "steps_note": "50",
        "micro": MICRO, "peak": 989e12,
        "prepared": {"flops_per_sample": {"256": 40e9, "1024": 43e9}, "parameters": 100.5e6},
        "rows": {
            "baseline": job, "fused": fused, "immediate": immediate, "best": best,
            "zero2": {"kind": "job", "reference": "baseline", "changed": rows["zero2"].changed,
                      "settings": {**settings, "zero_stage": 2}, "failed": "exit code 1"},
            "hf": {"kind": "hf", "ms_per_step": 160.0, "samples_per_s": 1600.0, "steps": 30, "warmup": 5},
            "bare": {"kind": "bare", "bare": 0.1, "ours": 0.105, "bare_samples_per_s": 2560.0, "blocks": 6,
                     "block_steps": 15, "width_ours": 68.0, "width_bare": 68.1, "flops_per_sample": 40.1e9},
            "ops": {"kind": "ops", "note": "x", "variants": {"baseline": {"optimizer": "DeepSpeedZeroOptimizer",
                    "parameter_tensors": 233, "ops": 4000.0, "ops_in_step": 1200.0, "kernels": 4100.0,
                    "launches_in_step": 1100.0, "device": "cuda:0"}}},
            "best_4x": {"kind": "best", "reference": "baseline_4x", "changed": rows["best_4x"].changed,
                        "skipped": "budget: 400 s used of 420, this row needs ~60 s"},
        },
    }  # fmt: skip


def test_the_section_shows_each_row_its_mfu_and_gain_and_the_targets(rows):
    lines = gl.section(_found(rows), "python benchmarks/gpu_levers.py")
    text = "\n".join(lines)
    assert lines[0] == gl.SECTION
    (fused,) = [line for line in lines if line.startswith("| fused |")]
    # 2500 samples/s x 40 GFLOP / 989 TFLOP/s = 10.1%; 2500 / 2000 = 1.25
    assert "| fused, sdpa; bfloat16, ZeRO-1 |" in fused
    assert "| 102.4 | 127.0 | 150.0 | 2,500 | 10.1% | 1.250 | 30.0 | 14.0 | 0.3100 |" in fused
    (baseline,) = [line for line in lines if line.startswith("| baseline | reference")]
    assert "| 8.1% | - |" in baseline
    assert "failed: exit code 1" in text
    assert "4 jobs ran and none tokenized the snapshot again." in text
    (immediate,) = [line for line in lines if line.startswith("| immediate |")]
    assert "asked, not in force: immediate_grad_update" in immediate
    assert "best took: fused; not measured when it ran, so left out: compile." in text
    assert "| MFU, best at batch 256 | 10.1% | >= 35%: not met |" in text
    assert "| job (best) / HF Trainer, samples/s, batch 256 | 1.562 | >= 1.2: met |" in text
    assert "| job (best) / bare loop on best's levers, samples/s | 0.977 | >= 1.0: not met |" in text
    assert "| MFU, best at batch 1024 | - | >= 45%: not measured |" in text
    assert "Not run: best_4x (budget: 400 s used of 420" in text
    assert "| baseline | DeepSpeedZeroOptimizer | 233 | 4000 | 1200 | 4100 | 1100 |" in text
    # The padding note says which figure is which.
    assert "useful work" in text and "40.00 GFLOP at batch 256" in text


def test_the_section_renders_a_run_cut_short_before_any_row(rows):
    found = _found(rows)
    found["rows"] = {}
    found["prepared"] = {"failed": "RuntimeError: x"}
    lines = gl.section(found, "python benchmarks/gpu_levers.py")
    assert lines[0] == gl.SECTION
    assert any("not measured" in line for line in lines)
    assert any(line.startswith("Op counts per optimizer step: not run") for line in lines)


def test_the_row_config_is_yaml_the_cli_reads(tmp_path, rows):
    settings = gl.settings_of(rows["immediate"], rows, MICRO)
    text = gl.row_config(gl.base_config(tmp_path / "enc", True), settings, 60, precision="bf16")
    config = yaml.safe_load(text)
    assert config["training"]["speed"]["immediate_grad_update"] is True
    assert config["training"]["deepspeed"] == {"zero_stage": 1, "precision": "bf16"}
    assert config["training"]["pretrained"] == (tmp_path / "enc").as_uri()


# -- a second call ----------------------------------------------------------------------------------


def test_an_earlier_call_s_measured_rows_are_read_back_and_its_skipped_or_failed_ones_are_not():
    measured = {"kind": "job", "samples_per_s": 812.5, "row_s": 51.0, "elapsed_s": 160.0, "mfu": 0.3}
    lines = [
        "LEVERS setup " + json.dumps({"device": "cuda"}),
        "LEVERS row baseline " + json.dumps({"kind": "job", "samples_per_s": 700.0, "row_s": 60.0}),
        "LEVERS row immediate " + json.dumps(measured),
        "LEVERS row compile " + json.dumps({"kind": "job", "failed": "RuntimeError: ..."}),
        "LEVERS row best " + json.dumps({"kind": "best", "skipped": "budget: 430 s used of 420"}),
        'LEVERS row packing {"kind": "job", "samples_per_s": 9',  # cut short when the call was killed
        "some line of a job's output",
    ]
    earlier = gl.earlier_rows(lines)
    assert set(earlier) == {"baseline", "immediate"}
    assert earlier["immediate"] == {"kind": "job", "samples_per_s": 812.5, "row_s": 51.0, "earlier": True}
    # best in the second call takes the lever the first call found
    settings, chosen = gl.best_settings({"immediate": gl.gain(earlier, "immediate", "baseline")}, MICRO, 1)
    assert chosen == ["immediate"] and settings["immediate_grad_update"] is True


def test_the_section_names_the_rows_an_earlier_call_measured(rows):
    found = _found(rows)
    found["rows"]["immediate"]["earlier"] = True
    text = "\n".join(gl.section(found, "python benchmarks/gpu_levers.py"))
    assert (
        "Measured by an earlier call (`--earlier`, read from its log, on that call's machine): immediate."
        in text
    )
