"""`training.speed.fused_qkv`: one projection for each self-attention's queries, keys and values.

BERT's self-attention projects the same hidden states three times: three matrix products forward,
six backward, and six parameter tensors per layer. Fused, it is one product three times as wide
and two tensors (NVIDIA's BERT and MosaicBERT's `Wqkv`): on a GPU, fewer kernel launches in both
passes and fewer tensors in each per-tensor pass of the optimizer (issue 55's "fewer parameter
tensors").

Only the training engine's module is fused (runtime.engine.build_engine). Its state dict keeps
transformers' names and shapes (split on the way out, joined on the way in), so a checkpoint's
model states, the final weights, the exported program and a Hugging Face directory are the plain
architecture's, and the model the run logs is built without the lever. The optimizer's state in a
checkpoint follows the engine's own parameters, the fused ones: a run resumes with the lever as
it was saved (runtime.resume.checkpoint.parameter_layout refuses the other).

Which modules: those whose forward is transformers' `BertSelfAttention.forward` (the models that
copy it: BERT, RoBERTa, ELECTRA, ...), compared by bytecode, since the fused forward below is that
one with the three projections made one.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
from torch import nn

PROJECTIONS = ("query", "key", "value")


def fuse_qkv(model: nn.Module) -> int:
    """Fuse every BERT-style self-attention of `model` in place; returns how many were fused.
    Raises FusionMismatch when a fused module does not compute what it computed before."""
    from transformers.models.bert.modeling_bert import BertSelfAttention

    bert = BertSelfAttention.forward.__code__
    found = [module for module in model.modules() if _is_bert_self_attention(module, bert)]
    for module in found:
        _fuse_checked(module)
    return len(found)


def fused_modules(model: nn.Module) -> int:
    """How many of `model`'s self-attentions run fused (what the job reports as in force)."""
    return sum(getattr(module.forward, "__func__", None) is _fused_forward for module in model.modules())


class FusionMismatch(RuntimeError):
    """The fused forward and the installed transformers' own disagree (another version's BERT)."""


def _fuse_checked(module: Any) -> None:
    """The fused forward is a copy of transformers' BertSelfAttention.forward: one random input
    through the module before and after proves it still is, whatever transformers is installed
    (the GPU image's may not be this machine's). flash_attention_2's kernels run on GPUs only,
    and the model is still on the host here: that kernel is not probed."""
    probe = None
    if module.config._attn_implementation != "flash_attention_2":
        query: nn.Linear = module.query
        generator = torch.Generator(device=query.weight.device).manual_seed(0)
        probe = torch.randn(
            2, 5, query.in_features, generator=generator, device=query.weight.device, dtype=query.weight.dtype
        )
        expected = _output(module, probe)
    _fuse(module)
    if probe is not None and not torch.allclose(_output(module, probe), expected, rtol=1e-4, atol=1e-5):
        raise FusionMismatch(
            f"{type(module).__name__} fused does not compute what it did: this transformers' "
            "self-attention differs from the one training.speed.fused_qkv copies"
        )


def _output(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    training = module.training
    module.eval()  # no dropout
    try:
        with torch.no_grad():
            return module(hidden_states)[0]  # type: ignore[no-any-return]
    finally:
        module.train(training)


def _is_bert_self_attention(module: nn.Module, bert: types.CodeType) -> bool:
    code = getattr(getattr(type(module), "forward", None), "__code__", None)
    if code is None or (code.co_code, code.co_names) != (bert.co_code, bert.co_names):
        return False
    layers = [getattr(module, name, None) for name in PROJECTIONS]
    if not all(isinstance(layer, nn.Linear) for layer in layers):
        return False
    return len({(layer.in_features, layer.out_features, layer.bias is not None) for layer in layers}) == 1  # type: ignore[union-attr]


def _fuse(module: nn.Module) -> None:
    query, key, value = (getattr(module, name) for name in PROJECTIONS)
    fused = nn.Linear(
        query.in_features, 3 * query.out_features, bias=query.bias is not None,
        device=query.weight.device, dtype=query.weight.dtype,
    )  # fmt: skip
    with torch.no_grad():
        fused.weight.copy_(torch.cat([query.weight, key.weight, value.weight]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([query.bias, key.bias, value.bias]))
    for name in PROJECTIONS:
        delattr(module, name)
    module.qkv = fused
    module.forward = types.MethodType(_fused_forward, module)  # type: ignore[method-assign]
    module.register_state_dict_post_hook(_split_on_save)
    module.register_load_state_dict_pre_hook(_join_on_load)


def _fused_forward(
    self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
    past_key_values: Any = None, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """BertSelfAttention.forward with one projection: the encoder case (no key/value cache)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if past_key_values is not None:
        raise RuntimeError("training.speed.fused_qkv fuses encoders' self-attention: no key/value cache")
    input_shape = hidden_states.shape[:-1]
    # (batch, tokens, 3 * heads * size) -> three (batch, heads, tokens, size) views, as the three
    # projections' `.view(...).transpose(1, 2)` give them.
    query, key, value = (
        self.qkv(hidden_states)
        .view(*input_shape, 3, -1, self.attention_head_size)
        .permute(2, 0, 3, 1, 4)
        .unbind(0)
    )
    eager = sys.modules[type(self).__module__].eager_attention_forward  # each model file's own
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
    output, weights = attention(
        self, query, key, value, attention_mask,
        dropout=0.0 if not self.training else self.dropout.p, scaling=self.scaling, **kwargs,
    )  # fmt: skip
    return output.reshape(*input_shape, -1).contiguous(), weights


def _split_on_save(module: nn.Module, state: dict[str, Any], prefix: str, metadata: Any) -> None:
    # In transformers' order (query.weight, query.bias, key.weight, ...): a state dict reads the same.
    fused = {kind: state.pop(f"{prefix}qkv.{kind}", None) for kind in ("weight", "bias")}
    parts = {kind: tensor.chunk(3) for kind, tensor in fused.items() if tensor is not None}
    for index, name in enumerate(PROJECTIONS):
        for kind, chunks in parts.items():
            state[f"{prefix}{name}.{kind}"] = chunks[index]


def _join_on_load(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    for kind in ("weight", "bias"):
        keys = [f"{prefix}{name}.{kind}" for name in PROJECTIONS]
        if all(key in state for key in keys):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(key) for key in keys])
