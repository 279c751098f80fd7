"""`text_encoder`: a small transformer encoder per text input (BERT's architecture, built from a
config: no download), the [CLS] states joined with the tabular features in an MLP head.

Its size is `training.hyperparameters.model_args` (`hidden_size`, `num_layers`, `num_heads`,
`intermediate_size`, `max_position_embeddings`, `dropout`, `head_hidden_sizes`), tunable like
any hyperparameter. One output, or one logit per class (multiclass). `activation_checkpointing`
(`training.activation_checkpointing`) recomputes each encoder layer's activations in the backward
pass instead of keeping them.

With `training.pretrained` the one text input's encoder is the directory's instead (any
architecture `transformers`' AutoModel loads: BERT, RoBERTa, DistilBERT, ...), read offline as
safetensors in float32 (DeepSpeed casts for bf16); a directory this package registered also
holds the head (`trainpipe_head.safetensors`), which is loaded when the features and classes are
the same, so a fine-tune from the champion starts from the whole champion. Under ZeRO-3 the
Trainer builds this inside transformers' DeepSpeed integration: every module is partitioned as it
is built and the weights are loaded a layer at a time (runtime.engine.model_construction).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from airflow_trainpipe.runtime.models.inputs import ModelInputs, is_exporting
from airflow_trainpipe.runtime.pretrained.directory import HEAD

log = logging.getLogger(__name__)


class TextEncoder(nn.Module):
    def __init__(
        self,
        inputs: ModelInputs,
        num_outputs: int,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        intermediate_size: int,
        max_position_embeddings: int,
        dropout: float,
        head_hidden_sizes: list[int],
        pretrained: str | None = None,
        activation_checkpointing: bool = False,
        attention: str | None = None,
    ):
        from transformers import BertConfig, BertModel

        kernel: dict[str, Any] = {"attn_implementation": attention} if attention is not None else {}

        super().__init__()
        self.encoders = nn.ModuleDict(
            {
                text.name: _pretrained_encoder(pretrained, kernel)
                if pretrained is not None
                else BertModel(
                    BertConfig(
                        vocab_size=text.vocab_size,
                        hidden_size=hidden_size,
                        num_hidden_layers=num_layers,
                        num_attention_heads=num_heads,
                        intermediate_size=intermediate_size,
                        max_position_embeddings=max_position_embeddings,
                        type_vocab_size=2,
                        pad_token_id=text.pad_id,
                        hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout,
                        **kernel,
                    ),
                    add_pooling_layer=False,
                )
                for text in inputs.text
            }
        )
        if activation_checkpointing:
            self._recompute_activations()
        if pretrained is not None:
            first: Any = next(iter(self.encoders.values()))
            hidden_size = int(first.config.hidden_size)
        self.encoder_arguments = _encoder_arguments(self.encoders)
        self.mask_kernels = {name: _prepared_mask_kernel(encoder) for name, encoder in self.encoders.items()}
        dims = [min(16, (c + 1) // 2 + 1) for c in inputs.cardinalities]
        self.embeddings = nn.ModuleList(
            nn.Embedding(c, d) for c, d in zip(inputs.cardinalities, dims, strict=True)
        )
        width = inputs.num_numeric + sum(dims) + hidden_size * len(inputs.text)
        layers: list[nn.Module] = []
        for size in head_hidden_sizes:
            layers += [nn.Linear(width, size), nn.GELU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, num_outputs))
        self.head = nn.Sequential(*layers)
        if pretrained is not None and (Path(pretrained) / HEAD).is_file():
            self._load_head(Path(pretrained) / HEAD)

    def _recompute_activations(self) -> None:
        """Each layer's activations recomputed in the backward pass instead of kept: less memory
        for a second forward of the encoder (the non-reentrant kind, which works with ZeRO-3's
        hooks and keeps dropout's RNG state)."""
        for encoder in self.encoders.values():
            encoder.gradient_checkpointing_enable(  # type: ignore[operator]  # a transformers model
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )

    def own_state_dict(self) -> dict[str, torch.Tensor]:
        """The layers beside the encoders: the categorical embeddings and the head."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("encoders.")}

    def _load_head(self, path: Path) -> None:
        """A registered model's head, when it fits this one (same features, same classes)."""
        from safetensors import safe_open

        own = {k: v for k, v in self.named_parameters() if not k.startswith("encoders.")}
        with safe_open(str(path), framework="pt") as handle:
            shapes = {k: list(handle.get_slice(k).get_shape()) for k in handle.keys()}  # noqa: SIM118
            fits = shapes == {k: list(getattr(v, "ds_shape", v.shape)) for k, v in own.items()}
            if not fits:
                log.warning(
                    "%s does not fit this model's head (other features or classes): the head starts fresh",
                    path,
                )
                return
            with _gathered(list(own.values())) as writes:
                if writes:
                    with torch.no_grad():
                        for key, parameter in own.items():
                            parameter.copy_(handle.get_tensor(key).to(parameter.dtype))

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        parts = [batch["numeric"]]
        codes = batch["categorical"]
        parts += [embedding(codes[:, i]) for i, embedding in enumerate(self.embeddings)]
        for name, encoder in self.encoders.items():
            if "cls_index" in batch["text"][name]:
                parts.append(self._packed_cls(name, encoder, batch["text"][name], batch["numeric"].dtype))
                continue
            arguments = self.encoder_arguments[name]
            text = {k: v for k, v in batch["text"][name].items() if k in arguments}
            kernel = self.mask_kernels[name]
            if kernel is not None and not is_exporting():
                keep = text["attention_mask"][:, None, None, :].bool()  # (batch, 1, 1, keys)
                text["attention_mask"] = _kernel_mask(keep, kernel, batch["numeric"].dtype)
            states = encoder(**text).last_hidden_state
            parts.append(states[:, 0])  # the [CLS] token's state
        return self.head(torch.cat(parts, dim=1))  # type: ignore[no-any-return]

    @property
    def packs_text(self) -> bool:
        """Whether every encoder takes packed rows: a prepared 4D mask and restarted position ids."""
        return all(
            self.mask_kernels[name] is not None
            and "position_ids" in inspect.signature(encoder.forward).parameters
            for name, encoder in self.encoders.items()
        )

    def _packed_cls(
        self, name: str, encoder: nn.Module, packed: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> torch.Tensor:
        """Each text's [CLS] state from packed rows (runtime.models.packing): a token attends to its
        own text's tokens alone (padding to padding), positions restart at each text."""
        segments = packed["segments"]
        same = (segments[:, :, None] == segments[:, None, :])[:, None]  # (rows, 1, width, width)
        mask = _kernel_mask(same, str(self.mask_kernels[name]), dtype)
        text = {
            "input_ids": packed["input_ids"],
            "position_ids": packed["position_ids"],
            "attention_mask": mask,
        }
        if "token_type_ids" in self.encoder_arguments[name]:
            text["token_type_ids"] = packed["token_type_ids"]
        states = encoder(**text).last_hidden_state
        return states.reshape(-1, states.shape[-1])[packed["cls_index"]]


def _encoder_arguments(encoders: nn.ModuleDict) -> dict[str, set[str]]:
    """What each encoder's forward takes: DistilBERT has no segment ids, and a RoBERTa's one
    segment embedding would be indexed out of range by the second segment's ids."""
    return {
        name: {
            key
            for key in ("input_ids", "attention_mask", "token_type_ids")
            if key in inspect.signature(encoder.forward).parameters
            and (key != "token_type_ids" or getattr(encoder.config, "type_vocab_size", 2) > 1)
        }
        for name, encoder in encoders.items()
    }


def _prepared_mask_kernel(encoder: nn.Module) -> str | None:
    """The attention kernel whose mask this module prepares itself, or None to leave it to
    transformers. Its masking_utils read the padding mask on the host to see whether any token is
    masked (`padding_mask.all()`): on a GPU, a wait for every queued kernel in each forward. A
    prepared 4D mask is taken as it is, by the models that build masks with masking_utils."""
    kernel = getattr(getattr(encoder, "config", None), "_attn_implementation", None)
    module = sys.modules.get(type(encoder).__module__)
    if kernel in ("sdpa", "eager") and hasattr(module, "create_bidirectional_mask"):
        return str(kernel)
    return None


def _kernel_mask(keep: torch.Tensor, kernel: str, dtype: torch.dtype) -> torch.Tensor:
    """A 4D mask of where each query attends (`keep`, bool) as `kernel` reads it: sdpa the bools,
    eager an additive 0 / dtype minimum."""
    if kernel == "sdpa":
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


def _pretrained_encoder(path: str, kernel: dict[str, Any]) -> nn.Module:
    """The directory's encoder (checked before: runtime.pretrained.directory), without its pooler:
    the head reads the [CLS] state itself, and a layer no loss reaches would hold no gradients."""
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(
        path, local_files_only=True, use_safetensors=True, dtype=torch.float32, **kernel
    )
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None
    return encoder  # type: ignore[no-any-return]


@contextmanager
def _gathered(parameters: list[nn.Parameter]) -> Iterator[bool]:
    """ZeRO-3 parameters whole for a write on rank 0 (then partitioned again); plain ones as they
    are. Yields whether this process writes."""
    if not any(hasattr(p, "ds_id") for p in parameters):
        yield True
        return
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(parameters, modifier_rank=0):
        yield dist.get_rank() == 0


def build_text_encoder(
    *,
    inputs: ModelInputs,
    task: str,
    num_outputs: int = 1,
    pretrained: str | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    dropout: float = 0.1,
    head_hidden_sizes: list[int] | tuple[int, ...] = (64,),
    activation_checkpointing: bool = False,
    attention: str | None = None,
) -> TextEncoder:
    del task  # in num_outputs already, as for tabular_mlp
    if not inputs.text:
        raise ValueError("text_encoder needs at least one text input (data.features.text)")
    if pretrained is not None and len(inputs.text) != 1:
        raise ValueError(f"a pretrained encoder reads one text input, got {len(inputs.text)}")
    if pretrained is None and hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    return TextEncoder(
        inputs,
        int(num_outputs),
        int(hidden_size),
        int(num_layers),
        int(num_heads),
        int(intermediate_size or 4 * hidden_size),
        int(max_position_embeddings),
        float(dropout),
        [int(h) for h in head_hidden_sizes],
        pretrained,
        bool(activation_checkpointing),
        attention,
    )
