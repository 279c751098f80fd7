"""`training.hyperparameters.model_args` of the built-in models, checked where the config is
read: a misspelt argument or a value the builder refuses fails `trainpipe check` naming its field,
not the train task (or every tuning trial) seconds into the job.

The arguments are listed here rather than read off the builders: the config never imports torch.
tests/config/test_model_args.py holds each list to its builder's signature. A model from an entry
point declares nothing: its builder is the judge, at run time.
"""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.config.base import FieldProblems
from airflow_trainpipe.config.suggest import did_you_mean

# Keyword arguments a user may give each built-in builder (runtime/models/): those the job passes
# itself (inputs, task, num_outputs, pretrained, activation_checkpointing, attention) are not.
BUILTIN_MODEL_ARGS: dict[str, tuple[str, ...]] = {
    "tabular_mlp": ("hidden_sizes", "dropout"),
    "text_encoder": (
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "max_position_embeddings",
        "dropout",
        "head_hidden_sizes",
    ),
}
ENCODER_SHAPE_ARGS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
)
"""`text_encoder` arguments that a pretrained directory's config.json decides."""


def model_args_problems(model: str, args: dict[str, Any], where: tuple[str | int, ...]) -> FieldProblems:
    """What a built-in `model` would refuse of `args`: an unknown name, a dropout outside [0, 1),
    a width its heads do not divide. `where`: the field path of `args` (the problem is at a key)."""
    known = BUILTIN_MODEL_ARGS.get(model)
    if known is None:
        return []
    problems: FieldProblems = []
    for name in args:
        if name not in known:
            problems.append(
                (
                    (*where, name),
                    f"{model} takes no argument {name!r}{did_you_mean(name, known)}; it takes "
                    f"{', '.join(known)}",
                )
            )
    dropout = args.get("dropout")
    if isinstance(dropout, int | float) and not 0 <= dropout < 1:
        problems.append(((*where, "dropout"), f"a dropout is a probability in [0, 1), got {dropout}"))
    width, heads = args.get("hidden_size", 64), args.get("num_heads", 2)
    shaped = model == "text_encoder" and isinstance(width, int) and isinstance(heads, int)
    if shaped and (heads < 1 or width % heads):
        problems.append(
            ((*where, "num_heads"), f"hidden_size {width} is not a multiple of num_heads {heads}")
        )
    return problems
