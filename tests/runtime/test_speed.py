"""training.speed on CPU ranks: each lever a CPU runs, on a real DeepSpeed engine, against the
step without it. (The job-level check, a text job resumed bit-exact with the levers on, is in
test_text_job.py; what only a GPU runs is refused, tests/config/test_speed.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from airflow_trainpipe.config import load_config
from airflow_trainpipe.config.speed import SpeedLevers, SpeedSection
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.stream import MicroBatch
from airflow_trainpipe.runtime.engine import build_engine, deepspeed_config, speed_in_force
from airflow_trainpipe.runtime.models import build_model
from airflow_trainpipe.runtime.models.inputs import ModelInputs, TextInput, text_lengths, text_widths
from airflow_trainpipe.runtime.models.packing import pack_text
from airflow_trainpipe.runtime.steps import StepRunner, by_length
from tests.conftest import EXAMPLE_CONFIGS

TEXT = ModelInputs(
    2, [3], [TextInput("subject", vocab_size=50, max_length=12, pad_id=0, sep_id=3, segments=1)]
)


# A one-rank group, and the comm op loaded as a job loads it (tests/runtime/conftest.py).
pytestmark = pytest.mark.usefixtures("jobs_comm_op", "one_rank_world")


@pytest.fixture(autouse=True)
def _deepspeed_sees_this_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr("deepspeed.comm.comm.cdb", None)  # DeepSpeed's view of the group ends with the test
    # ZeRO clones the world group once per process: the clone dies with this module's group.
    monkeypatch.setattr("deepspeed.utils.groups._WORLD_GROUP", None)


def _spec(precision: str = "auto", **speed: Any) -> TrainSpec:
    config = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    deepspeed = config.training.deepspeed.model_copy(update={"precision": precision})
    training = config.training.model_copy(update={"speed": SpeedSection(**speed), "deepspeed": deepspeed})
    return TrainSpec(
        config=config.model_copy(update={"training": training}), run_id="r", data_files=["file:///x.parquet"]
    )


def _engine(spec: TrainSpec, levers: SpeedLevers | None) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    ds = deepspeed_config(spec, global_batch=8, world_size=1, universal=False, on_gpu=False)
    return build_engine(model, spec, ds, lambda step: 1.0, levers)


def _one_step(engine: Any, rows: int = 8) -> float:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, 3, generator=generator), torch.randn(rows, 1, generator=generator)
    dtype = next(engine.module.parameters()).dtype
    loss = ((engine(x.to(dtype)).float() - y) ** 2).mean()
    engine.backward(loss)
    engine.step()
    return float(loss)


def _weights(engine: Any) -> list[torch.Tensor]:
    return [p.detach().float().clone() for p in engine.module.parameters()]


def test_a_cpu_rank_stops_a_gpu_config_before_it_joins_a_group() -> None:
    from airflow_trainpipe.runtime.setup import speed_levers

    asked = SpeedSection(compile="reduce-overhead", data_on_device=True)
    with pytest.raises(TrainpipeError, match="this rank has no GPU") as caught:
        speed_levers(asked, on_gpu=False)
    assert "training.speed.compile" in str(caught.value) and "training.speed.data_on_device" in str(
        caught.value
    )
    assert speed_levers(asked, on_gpu=True).compile_mode == "reduce-overhead"


def test_the_fused_adamw_steps_as_torchs_default_does() -> None:
    spec = _spec()
    plain, fused = (_engine(spec, SpeedSection(optimizer=kind).for_rank(False)) for kind in ("auto", "fused"))
    assert speed_in_force(fused)["fused_optimizer"] and not speed_in_force(plain)["fused_optimizer"]
    for _ in range(3):
        assert _one_step(fused) == pytest.approx(_one_step(plain), rel=1e-6)
    for a, b in zip(_weights(fused), _weights(plain), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_immediate_grad_update_steps_with_deepspeeds_bf16_optimizer() -> None:
    spec = _spec(immediate_grad_update=True)
    ds = deepspeed_config(spec, global_batch=8, world_size=1, universal=False, on_gpu=False)
    assert "immediate_grad_update" not in ds["bf16"]  # fp32 (a CPU rank's auto): nothing to do
    bf16 = _spec(precision="bf16", immediate_grad_update=True)
    engine = _engine(bf16, bf16.config.training.speed.for_rank(False))
    assert type(engine.optimizer).__name__ == "BF16_Optimizer"
    assert speed_in_force(engine)["immediate_grad_update"]
    before = _weights(engine)
    losses = [_one_step(engine) for _ in range(3)]
    assert all(np.isfinite(losses)) and any(
        (a != b).any() for a, b in zip(before, _weights(engine), strict=True)
    )
    without = _engine(_spec(precision="bf16"), None)
    assert type(without.optimizer).__name__ != "BF16_Optimizer"  # ZeRO-1's own, bf16 gradients
    assert not speed_in_force(without)["immediate_grad_update"]


def test_a_compiled_engine_steps_as_the_eager_one() -> None:
    spec = _spec()
    eager, compiled = _engine(spec, None), _engine(spec, SpeedSection(compile="default").for_rank(False))
    assert speed_in_force(compiled)["compiled"] and not speed_in_force(eager)["compiled"]
    for _ in range(2):
        assert _one_step(compiled) == pytest.approx(_one_step(eager), rel=1e-5)
    for a, b in zip(_weights(compiled), _weights(eager), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _text_model(attention: str | None) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(
        "text_encoder", inputs=TEXT, task="regression", hidden_size=16, num_layers=1, num_heads=2,
        dropout=0.0, attention=attention,
    ).eval()  # fmt: skip


def _text_rows(lengths: list[int]) -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = np.zeros((len(lengths), 2 + 1 + 12), np.float32)
    rows[:, :2] = rng.normal(size=(len(lengths), 2))
    rows[:, 2] = rng.integers(0, 3, len(lengths))
    for i, n in enumerate(lengths):
        rows[i, 3 : 3 + n] = rng.integers(4, 50, n)
    return rows


def test_the_attention_kernel_is_chosen_and_changes_no_output() -> None:
    x = torch.from_numpy(_text_rows([5, 12, 3, 8]))
    eager, sdpa = _text_model("eager"), _text_model("sdpa")
    assert speed_in_force(eager)["attention"] == "eager" and speed_in_force(sdpa)["attention"] == "sdpa"
    assert speed_in_force(_text_model(None))["attention"] == "sdpa"  # transformers' default
    with torch.no_grad():
        torch.testing.assert_close(eager(x), sdpa(x), rtol=1e-5, atol=1e-5)
        # The masks the encoder prepares itself are the ones transformers would build.
        prepared = eager(x)
        eager.model.mask_kernels = {"subject": None}
        torch.testing.assert_close(eager(x), prepared)
    with pytest.raises(TrainpipeError, match="no attention kernel to choose"):
        build_model("tabular_mlp", num_numeric=3, cardinalities=[], task="regression", attention="eager")


class _HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value by the host (`.item()`, `int(t)`): each one waits, on a
    GPU, for every kernel queued before it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_widths_counted_on_the_host_spare_the_forward_a_read_of_the_device() -> None:
    rows = _text_rows([5, 12, 3, 8])
    model, x = _text_model(None), torch.from_numpy(rows)
    widths = text_widths(text_lengths(rows, TEXT), TEXT)
    assert widths == (12,) and text_widths(text_lengths(rows[[0, 2]], TEXT), TEXT, multiple=8) == (8,)
    with torch.no_grad():
        with _HostReads() as counted:
            given = model(x, widths=widths)
        assert counted.reads == 0  # neither the widths nor whether any token is padding
        with _HostReads() as counted:
            found = model(x)
        assert counted.reads >= 1  # the batch's longest row read off the device
    torch.testing.assert_close(given, found)


class _TextRows:
    """A stream of text rows held in memory (the real stream has tests of its own)."""

    inputs = TEXT

    def __init__(self) -> None:
        rng = np.random.default_rng(3)
        self.x = _text_rows(list(rng.integers(1, 13, 16)))
        self.y = rng.normal(size=16).astype(np.float32)

    def take_step(self, epoch: int, global_range: Any, ranges: list[tuple[int, int]]) -> list[MicroBatch]:
        return [
            MicroBatch(self.x[a:b], self.y[a:b], text_lengths(self.x[a:b], TEXT), self.x[a:b])
            for a, b in ranges
        ]


def _text_engine(spec: TrainSpec, levers: SpeedLevers | None = None) -> Any:
    config = {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.0, "zero_optimization": {"stage": 0}, "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 62,
    }  # fmt: skip
    return build_engine(_text_model(None).train(), spec, config, lambda step: 1.0, levers)


@pytest.mark.parametrize("lever", ["group_by_length", "packing"])
def test_a_text_step_reads_nothing_off_the_device_and_its_lever_keeps_the_update(lever: str) -> None:
    """Grouping by length changes which rows share a micro-batch, packing how they are laid out:
    the step's update is the one without, and neither makes the host wait for the device."""
    spec = _spec()
    rows = _TextRows()
    stepped = {}
    for on in (False, True):
        # fused: torch's per-tensor loop reads each step count (a host tensor on GPUs too)
        levers = SpeedSection(optimizer="fused", **{lever: on}).for_rank(False)
        engine = _text_engine(spec, levers)
        runner = StepRunner(engine, rows, "regression", torch.device("cpu"), torch.float32, levers=levers)  # type: ignore[arg-type]
        with _HostReads() as counted:
            runner.run(ResumableSampler(16, 8, 2, 1, 0, seed=3), 1, Timing(0, 0.0))
        assert counted.reads == 0, "the step waited for the device"
        stepped[on] = _weights(engine)
    for a, b in zip(stepped[True], stepped[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_grouping_sorts_a_steps_rows_by_length_into_micro_batches_of_the_same_sizes() -> None:
    rows = _TextRows()
    batches = rows.take_step(0, (0, 16), [(0, 8), (8, 16)])
    grouped = by_length(batches, torch.device("cpu"))
    assert [len(b) for b in grouped] == [8, 8]
    assert sorted(map(tuple, np.concatenate([b.x for b in grouped]))) == sorted(map(tuple, rows.x))
    assert np.all(np.diff(np.concatenate([b.lengths[:, 0] for b in grouped])) >= 0)
    widths = [text_widths(b.lengths, TEXT)[0] for b in batches]
    assert sum(text_widths(b.lengths, TEXT)[0] for b in grouped) < sum(widths)  # less padding
    on_device = [MicroBatch(torch.from_numpy(b.x), torch.from_numpy(b.y), b.lengths, b.x) for b in batches]
    for a, b in zip(by_length(on_device, torch.device("cpu")), grouped, strict=True):
        np.testing.assert_array_equal(a.x.numpy(), b.x)
        np.testing.assert_array_equal(a.y.numpy(), b.y)


def test_packing_places_every_token_once_and_restarts_positions_at_each_text() -> None:
    rows = _text_rows([5, 12, 3, 8, 2, 1])
    lengths = text_lengths(rows, TEXT)
    (packed,) = pack_text(rows, TEXT, lengths).values()
    assert packed.input_ids.shape == (3, 12)  # 31 tokens in rows of the longest text: 12+0, 8+3+1, 5+2
    flat = {name: array.reshape(-1) for name, array in packed.arrays().items() if name != "cls_index"}
    for i, n in enumerate(lengths[:, 0]):
        at = np.flatnonzero(flat["segments"] == i + 1)
        assert len(at) == n and at[0] == packed.cls_index[i] and np.all(np.diff(at) == 1)
        np.testing.assert_array_equal(flat["input_ids"][at], rows[i, 3 : 3 + n])
        np.testing.assert_array_equal(flat["position_ids"][at], np.arange(n))
    assert np.all(flat["input_ids"][flat["segments"] == 0] == 0)  # the rest is padding


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_texts_give_each_text_the_state_it_has_alone(attention: str) -> None:
    rows = _text_rows([5, 12, 3, 8, 2, 1, 11, 4])
    model, x = _text_model(attention), torch.from_numpy(rows)
    assert model.model.packs_text
    packed = {
        name: {key: torch.from_numpy(array) for key, array in text.arrays().items()}
        for name, text in pack_text(rows, TEXT, text_lengths(rows, TEXT)).items()
    }
    assert packed["subject"]["input_ids"].shape[0] < len(rows)
    with torch.no_grad(), _HostReads() as counted:
        together = model(x, packed=packed)
    assert counted.reads == 0
    with torch.no_grad():
        torch.testing.assert_close(together, model(x), rtol=1e-5, atol=1e-5)


def test_packing_says_which_encoders_cannot_take_packed_rows() -> None:
    engine = _text_engine(_spec())
    engine.module.model.mask_kernels = {"subject": None}  # a model whose masks transformers keep
    levers = SpeedSection(packing=True).for_rank(False)
    with pytest.raises(TrainpipeError, match="cannot take packed rows"):
        StepRunner(engine, _TextRows(), "regression", torch.device("cpu"), torch.float32, levers=levers)  # type: ignore[arg-type]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_fused_qkv_computes_what_the_three_projections_do_and_keeps_their_state_dict(attention: str) -> None:
    """One projection three times as wide: the same output on padded rows and on packed ones,
    two parameter tensors where there were six, and transformers' own names and shapes in the
    state dict, which loads back into either model."""
    from airflow_trainpipe.runtime.models.fused_qkv import fuse_qkv

    rows = _text_rows([5, 12, 3, 8, 2, 1])
    x = torch.from_numpy(rows)
    packed = {
        name: {key: torch.from_numpy(array) for key, array in text.arrays().items()}
        for name, text in pack_text(rows, TEXT, text_lengths(rows, TEXT)).items()
    }
    plain, fused = _text_model(attention), _text_model(attention)
    assert fuse_qkv(fused) == 1  # the one layer's self-attention
    assert len(list(fused.parameters())) == len(list(plain.parameters())) - 4
    with torch.no_grad():
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(fused(x, packed=packed), plain(x, packed=packed), rtol=1e-6, atol=1e-6)
    saved, expected = fused.state_dict(), plain.state_dict()
    assert list(saved) == list(expected)
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=0, atol=0)
    with torch.no_grad():
        for parameter in fused.parameters():
            parameter.zero_()
    fused.load_state_dict(expected)  # joined on the way in
    with torch.no_grad():
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-6, atol=1e-6)


def test_a_fused_qkv_engine_steps_as_the_plain_one_and_says_so() -> None:
    spec = _spec()
    rows, stepped = _TextRows(), {}
    for on in (False, True):
        levers = SpeedSection(fused_qkv=on).for_rank(False)
        engine = _text_engine(spec, levers)
        assert speed_in_force(engine)["fused_qkv"] is on
        runner = StepRunner(engine, rows, "regression", torch.device("cpu"), torch.float32, levers=levers)  # type: ignore[arg-type]
        runner.run(ResumableSampler(16, 8, 2, 1, 0, seed=3), 1, Timing(0, 0.0))
        stepped[on] = engine.module.state_dict()  # transformers' names either way
    assert list(stepped[True]) == list(stepped[False])
    for key, value in stepped[False].items():
        torch.testing.assert_close(stepped[True][key], value, rtol=1e-5, atol=1e-6)


def test_fused_qkv_says_when_a_model_has_no_attention_to_fuse() -> None:
    spec = _spec()
    with pytest.raises(TrainpipeError, match="has no BERT-style self-attention"):
        _engine(spec, SpeedSection(fused_qkv=True).for_rank(False))


def test_a_fusion_that_computes_something_else_is_refused_before_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused forward copies transformers' BertSelfAttention: each module is probed before and
    after, so another transformers (the GPU image's) whose attention differs stops the job instead
    of training a different model. Here keys and values are joined in the wrong order."""
    from airflow_trainpipe.runtime.models import fused_qkv

    monkeypatch.setattr(fused_qkv, "PROJECTIONS", ("query", "value", "key"))
    with pytest.raises(TrainpipeError, match="fused does not compute what it did"):
        _text_engine(_spec(), SpeedSection(fused_qkv=True).for_rank(False))
