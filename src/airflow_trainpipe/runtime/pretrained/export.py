"""A fine-tuned model as one Hugging Face directory, written by rank 0 from the consolidated weights.

`AutoModel.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` load it directly (the
encoder, fine-tuned, as safetensors with its config.json; the tokenizer files it was read with);
`trainpipe_head.safetensors` and `trainpipe.json` hold what a plain encoder has no place for (the
head over [CLS] and the tabular features), so a pipeline fine-tuning from this version
(`training.pretrained: models:/NAME@champion`) starts from the whole model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from airflow_trainpipe.runtime.pretrained.directory import (
    HEAD,
    HEAD_CONFIG,
    TOKENIZER_FILES,
    PretrainedDirectory,
)


def save_hf_directory(
    model: torch.nn.Module, source: PretrainedDirectory, transform: Any, target: Path
) -> Path:
    """`model`: a built text_encoder (behind `MappedInputs`) holding the final weights."""
    from safetensors.torch import save_file

    encoder_model: Any = getattr(model, "model", model)  # the TextEncoder behind MappedInputs
    ((name, encoder),) = encoder_model.encoders.items()
    target.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(str(target))  # config.json + model.safetensors
    for file in TOKENIZER_FILES:
        if (source.path / file).is_file():
            shutil.copyfile(source.path / file, target / file)
    head = {k: v.detach().float().contiguous().cpu() for k, v in encoder_model.own_state_dict().items()}
    save_file(head, str(target / HEAD))
    fitted = next(t for t in transform.text if t["name"] == name)
    (target / HEAD_CONFIG).write_text(
        json.dumps(
            {
                "model": "text_encoder",
                "task": transform.task,
                "classes": transform.classes,
                "text_input": {
                    "name": name,
                    "columns": fitted["columns"],
                    "max_length": fitted["max_length"],
                },
                "inputs": transform.input_names,
                "fine_tuned_from": {"source": source.label, "sha256": source.sha256},
            },
            indent=1,
        )
    )
    return target
