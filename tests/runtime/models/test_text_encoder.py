"""The mapping contract: a model gets numeric, categorical and per-text-input tensors; the text
encoder built from a config; batches padded to their longest row; plugins of both contracts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.models import build_model
from airflow_trainpipe.runtime.models.inputs import MappedInputs, ModelInputs, TextInput
from airflow_trainpipe.runtime.serving import export_network

INPUTS = ModelInputs(num_numeric=3, cardinalities=[4], text=[TextInput("ticket", 300, 16, 0, 3, 2)])


def _rows(lengths: list[int], width: int = 16) -> torch.Tensor:
    """Rows of 3 dense values, a code, then ids `[CLS]=2 ... [SEP]=3 ... [SEP]=3`, 0-padded."""
    x = torch.zeros(len(lengths), 3 + 1 + width)
    x[:, :3] = torch.randn(len(lengths), 3)
    x[:, 3] = torch.tensor([1.0, 2.0, 3.0, 0.0])[: len(lengths)]
    for row, n in enumerate(lengths):
        ids = torch.randint(10, 300, (n,)).float()
        ids[0], ids[n // 2], ids[n - 1] = 2, 3, 3
        x[row, 4 : 4 + n] = ids
    return x


def test_the_mapping_carries_exact_ids_a_mask_and_segments_cut_to_the_batch_s_longest_row() -> None:
    seen: dict = {}

    class Probe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))

        def forward(self, batch: dict) -> torch.Tensor:
            seen.update(batch)
            return batch["numeric"].sum(dim=1, keepdim=True)

    x = _rows([5, 9, 7])
    x[0, 5] = 299.0  # not exact in bf16 (8 bits of mantissa): the ids must never pass through it
    MappedInputs(Probe(), INPUTS)(x)
    text = seen["text"]["ticket"]
    assert text["input_ids"].shape == (3, 9) and text["input_ids"].dtype == torch.int64  # not 16
    assert int(text["input_ids"][0, 1]) == 299
    assert text["attention_mask"].sum(dim=1).tolist() == [5, 9, 7]
    # Segment 1 after the first [SEP], on the text only.
    assert text["token_type_ids"][1].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert seen["numeric"].dtype == torch.bfloat16 and seen["categorical"].tolist() == [[1], [2], [3]]


def test_a_compiled_model_cuts_texts_to_the_longest_row_whatever_torch_says_of_exporting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Dynamo answers torch.compiler.is_exporting() True in any compiled graph on torch before
    # pytorch/pytorch#176499 (2.11, the GPU image's): the model code asked it, so a job with
    # training.speed.compile padded every text to max_length there, never on this machine's torch.
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    torch.manual_seed(0)
    model = build_model("text_encoder", inputs=INPUTS, task="binary_classification", num_outputs=1,
                        hidden_size=32, num_layers=1, num_heads=2, dropout=0.0)  # fmt: skip
    assert isinstance(model, MappedInputs)
    mapped = torch.compile(model.mapping, backend="eager")(_rows([5, 9, 7]))
    assert mapped["text"]["ticket"]["input_ids"].shape == (3, 9)  # not 16


def test_the_text_encoder_is_built_from_a_config_and_exports_with_the_training_outputs(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = build_model("text_encoder", inputs=INPUTS, task="multiclass_classification", num_outputs=4,
                        hidden_size=32, num_layers=1, num_heads=2, dropout=0.0)  # fmt: skip
    assert isinstance(model, MappedInputs)
    encoder = model.model.encoders["ticket"]
    assert encoder.config.vocab_size == 300 and encoder.config.num_hidden_layers == 1
    x = _rows([5, 9, 7])
    model.eval()
    with torch.no_grad():
        eager = model(x)  # cut to 9 tokens
    export_network(model, x.shape[1], tmp_path / "network.pt2")  # as the job logs it
    served = torch.export.load(str(tmp_path / "network.pt2")).module()(x)  # it reads all 16
    assert eager.shape == (3, 4)
    torch.testing.assert_close(served, eager, rtol=1e-5, atol=1e-6)


def test_builders_of_the_first_contract_keep_working_and_cannot_be_given_text() -> None:
    tabular = ModelInputs(num_numeric=3, cardinalities=[4], text=[])
    model = build_model("tabular_mlp", inputs=tabular, task="binary_classification", num_outputs=1)
    assert not isinstance(model, MappedInputs) and model(torch.zeros(2, 4)).shape == (2, 1)
    with pytest.raises(TrainpipeError, match=r"model 'tabular_mlp' takes no text inputs"):
        build_model("tabular_mlp", inputs=INPUTS, task="binary_classification", num_outputs=1)


def test_a_mapping_plugin_gets_the_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from airflow_trainpipe.runtime import models

    class TwoTower(torch.nn.Module):
        def __init__(self, inputs: ModelInputs) -> None:
            super().__init__()
            self.towers = torch.nn.ModuleDict(
                {t.name: torch.nn.EmbeddingBag(t.vocab_size, 8) for t in inputs.text}
            )
            self.out = torch.nn.Linear(8, 1)

        def forward(self, batch: dict) -> torch.Tensor:
            text = batch["text"]["ticket"]
            return self.out(self.towers["ticket"](text["input_ids"], per_sample_weights=None, offsets=None))

    def build_two_tower(*, inputs: ModelInputs, task: str, num_outputs: int = 1) -> torch.nn.Module:
        return TwoTower(inputs)

    plugin = EntryPoint("two_tower", f"{__name__}:build_two_tower", "airflow_trainpipe.models")
    monkeypatch.setattr(models, "entry_points", lambda group: [plugin])
    monkeypatch.setattr(EntryPoint, "load", lambda self: build_two_tower)
    model = build_model("two_tower", inputs=INPUTS, task="binary_classification", num_outputs=1)
    assert isinstance(model, MappedInputs) and model(_rows([5, 9])).shape == (2, 1)


def test_a_text_encoder_that_cannot_be_built_says_why() -> None:
    with pytest.raises(TrainpipeError, match=r"hidden_size 30 is not a multiple of num_heads 4"):
        build_model("text_encoder", inputs=INPUTS, task="binary_classification", num_outputs=1,
                    hidden_size=30, num_heads=4)  # fmt: skip


def test_activation_checkpointing_recomputes_the_encoder_and_changes_no_gradient() -> None:
    x = _rows([16, 9, 12])
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(
            "text_encoder", inputs=INPUTS, task="regression", hidden_size=32, num_layers=2, num_heads=2,
            dropout=0.0, activation_checkpointing=checkpointing,
        )  # fmt: skip
        model.train()
        model(x).sum().backward()
        encoder = model.model.encoders["ticket"]
        assert encoder.is_gradient_checkpointing is checkpointing
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-5, atol=1e-6, msg=key)


def test_a_model_that_cannot_recompute_activations_says_so() -> None:
    with pytest.raises(TrainpipeError, match="'tabular_mlp' cannot recompute activations"):
        build_model(
            "tabular_mlp", inputs=ModelInputs(3, [], []), task="regression", activation_checkpointing=True
        )
