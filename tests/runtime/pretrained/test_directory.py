"""A pretrained directory that cannot be used fails before any step, naming its path and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory, directory_sha256
from airflow_trainpipe.runtime.pretrained.errors import PretrainedError
from tests.helpers.pretrained import save_encoder_directory

TEXTS = ["my order never arrived", "the app crashes at login", "please change my billing address"] * 40


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_encoder_directory(tmp_path_factory.mktemp("pretrained") / "encoder", TEXTS, positions=64)


@pytest.fixture
def copy(encoder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(encoder, tmp_path / "copy"))


def _refused(path: Path, max_length: int = 32) -> str:
    with pytest.raises(PretrainedError) as caught:
        PretrainedDirectory(path, f"file://{path}").check(max_length)
    assert not caught.value.retryable
    assert f"pretrained directory file://{path}" in str(caught.value)
    return str(caught.value)


def test_a_complete_directory_passes_and_names_its_files(encoder: Path) -> None:
    directory = PretrainedDirectory(encoder, "x")
    directory.check(64)
    assert set(directory.file_digests()) == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert len(directory_sha256(directory.file_digests())) == 64


def test_a_missing_directory(tmp_path: Path) -> None:
    assert "does not exist" in _refused(tmp_path / "nowhere")


def test_a_directory_without_its_tokenizer(copy: Path) -> None:
    (copy / "tokenizer.json").unlink()
    assert "has no tokenizer.json" in _refused(copy)


def test_a_directory_without_weights(copy: Path) -> None:
    (copy / "model.safetensors").unlink()
    assert "has no weights: expected model.safetensors" in _refused(copy)


def test_pickled_weights_are_refused_even_beside_safetensors(copy: Path) -> None:
    (copy / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    message = _refused(copy)
    assert "pickled weights (pytorch_model.bin)" in message and "unpickling runs code" in message


def test_weights_of_another_architecture_than_its_config(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "intermediate_size": 128}))
    message = _refused(copy)
    assert "not those of the architecture in config.json (bert)" in message
    assert "of another shape, e.g. embeddings.word_embeddings.weight is [" in message


def test_weights_missing_layers_of_its_config(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    assert "tensors are missing, e.g. encoder.layer.1." in _refused(copy)


def test_a_tokenizer_with_more_tokens_than_the_encoder_embeds(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    tokens = config["vocab_size"]
    # The embedding matrix shrunk with the config: the weights still fit, the tokenizer does not.
    from safetensors.torch import load_file, save_file

    weights = load_file(str(copy / "model.safetensors"))
    weights["embeddings.word_embeddings.weight"] = weights["embeddings.word_embeddings.weight"][:50].clone()
    save_file(weights, str(copy / "model.safetensors"))
    (copy / "config.json").write_text(json.dumps({**config, "vocab_size": 50}))
    assert f"its tokenizer has {tokens} tokens but the encoder embeds 50" in _refused(copy)


def test_a_truncated_weights_file(copy: Path) -> None:
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[:100])
    assert "model.safetensors is not a readable safetensors file" in _refused(copy)


def test_max_length_over_the_encoders_positions(encoder: Path) -> None:
    assert "reads at most 64 positions" in _refused(encoder, max_length=128)


def test_an_unknown_model_type(copy: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "not_a_model"}))
    assert "does not describe a model transformers can build" in _refused(copy)


def test_the_tokenizer_becomes_the_text_input(encoder: Path) -> None:
    import pyarrow as pa

    from airflow_trainpipe.runtime.data.text import TextEncoder

    fitted = PretrainedDirectory(encoder, "x").text_input("subject", ["subject", "body"], 16)
    assert fitted["kind"] == "pretrained" and fitted["pad_id"] == 0 and fitted["max_length"] == 16
    ids = TextEncoder(fitted).ids(pa.table({"subject": ["my order"], "body": ["never arrived " * 20]}))
    assert ids.shape == (1, 16) and ids[0, 0] == fitted["cls_id"] and ids[0, -1] == fitted["sep_id"]
