"""`tabular_mlp`: embedding sizes, layer layout, and the forward pass on numeric values plus codes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.models import build_model
from airflow_trainpipe.runtime.models.tabular_mlp import TabularMLP, build_tabular_mlp


def _mlp(**kwargs: object) -> TabularMLP:
    args: dict[str, object] = {"num_numeric": 3, "cardinalities": [4, 7], "task": "binary_classification"}
    return build_tabular_mlp(**{**args, **kwargs})  # type: ignore[arg-type]


def _linears(model: TabularMLP) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in model.mlp if isinstance(m, nn.Linear)]


@pytest.mark.parametrize(
    ("cardinalities", "dims"),
    [([2, 3], [2, 3]), ([28, 29], [15, 16]), ([31, 1000], [16, 16]), ([1], [2])],
)
def test_embedding_width_is_half_the_cardinality_plus_one_capped_at_16(
    cardinalities: list[int], dims: list[int]
) -> None:
    model = _mlp(num_numeric=5, cardinalities=cardinalities, hidden_sizes=[8])
    assert [(e.num_embeddings, e.embedding_dim) for e in model.embeddings] == list(
        zip(cardinalities, dims, strict=True)
    )
    assert _linears(model)[0] == (5 + sum(dims), 8)  # the MLP reads numeric values and every embedding


def test_default_layout_is_two_hidden_relu_layers_without_dropout_and_one_output() -> None:
    model = _mlp(cardinalities=[])
    assert [type(m) for m in model.mlp] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert _linears(model) == [(3, 64), (64, 32), (32, 1)]


def test_dropout_follows_each_hidden_activation_when_asked_for() -> None:
    model = _mlp(hidden_sizes=[6, 5, 4], dropout=0.25)
    assert [type(m).__name__ for m in model.mlp] == ["Linear", "ReLU", "Dropout"] * 3 + ["Linear"]
    assert {m.p for m in model.mlp if isinstance(m, nn.Dropout)} == {0.25}
    assert _linears(model)[1:] == [(6, 5), (5, 4), (4, 1)]


def test_yaml_numbers_for_hidden_sizes_become_layer_widths() -> None:
    assert _linears(_mlp(hidden_sizes=(8.0, 3), dropout=0))[:2] == [(3 + 3 + 5, 8), (8, 3)]


def test_both_tasks_get_the_same_network() -> None:
    torch.manual_seed(0)
    binary = _mlp(hidden_sizes=[4])
    torch.manual_seed(0)
    regression = _mlp(hidden_sizes=[4], task="regression")
    assert binary.state_dict().keys() == regression.state_dict().keys()
    assert all(
        torch.equal(a, b)
        for a, b in zip(binary.state_dict().values(), regression.state_dict().values(), strict=True)
    )


def test_forward_concatenates_numeric_values_with_the_embeddings_of_the_float_codes() -> None:
    torch.manual_seed(1)
    model = _mlp(hidden_sizes=[5]).eval()
    x = torch.tensor([[0.5, -1.0, 2.0, 3.0, 0.0], [1.5, 0.0, -2.0, 1.0, 6.0]])
    first, last = model.mlp[0], model.mlp[2]
    assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
    expected = []
    for row in x:
        codes = [int(row[3]), int(row[4])]
        features = torch.cat(
            [row[:3], model.embeddings[0].weight[codes[0]], model.embeddings[1].weight[codes[1]]]
        )
        hidden = torch.clamp(first.weight @ features + first.bias, min=0)
        expected.append(last.weight @ hidden + last.bias)
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 1)
    torch.testing.assert_close(out, torch.stack(expected).detach())


def test_a_code_beyond_the_vocabulary_is_refused() -> None:
    model = _mlp(hidden_sizes=[4])
    with pytest.raises(IndexError, match="index out of range"):
        model(torch.tensor([[0.0, 0.0, 0.0, 4.0, 0.0]]))  # cardinality 4: codes 0..3


def test_dropout_is_random_in_training_and_off_in_evaluation() -> None:
    torch.manual_seed(2)
    model = _mlp(cardinalities=[], hidden_sizes=[256], dropout=0.5)
    x = torch.ones(1, 3)
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


def test_the_registry_builds_it_by_name_and_names_a_rejected_argument() -> None:
    network = build_model(
        "tabular_mlp", num_numeric=2, cardinalities=[3], task="regression", hidden_sizes=[4]
    )
    assert isinstance(network, TabularMLP) and _linears(network) == [(2 + 3, 4), (4, 1)]
    with pytest.raises(
        TrainpipeError,
        match=r"model 'tabular_mlp' rejected its arguments \(training\.hyperparameters\.model_args\).*depth",
    ):
        build_model("tabular_mlp", num_numeric=2, cardinalities=[3], task="regression", depth=3)
