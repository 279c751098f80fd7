"""A Hugging Face format directory on local disk: checked whole before any step, then read.

What it must hold: `config.json`, the weights as safetensors (`model.safetensors`, or shards with
their `model.safetensors.index.json`) and the tokenizer as `tokenizer.json` (a fast tokenizer's
own document) with its `tokenizer_config.json`. Pickled weights (`pytorch_model.bin`, `.pt`,
`.pth`) are refused, even beside safetensors: unpickling runs code, and a directory someone else
wrote is outside the trust boundary (README, "Trust"). Nothing is ever downloaded: the checks read
the files here, and `transformers` is called with `local_files_only`.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow_trainpipe.contracts.artifacts import HEAD_CONFIG_FILE
from airflow_trainpipe.runtime.pretrained.errors import PretrainedError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILES = (
    TOKENIZER,
    TOKENIZER_CONFIG,
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
HEAD = "trainpipe_head.safetensors"
"""A fine-tuned model's own layers beside the encoder (the head over [CLS] and the tabular
features): present in a directory this package registered, so a fine-tune from the champion
starts from the whole model."""
HEAD_CONFIG = HEAD_CONFIG_FILE  # contracts/artifacts.py


class PretrainedDirectory:
    """One directory: `check()` says what is wrong with it, naming `label` (where it came from)."""

    def __init__(self, path: Path, label: str, sha256: str = ""):
        self.path, self.label = Path(path), label
        self.sha256 = sha256
        """Of its pinned bytes (runtime.pretrained.source), when known."""

    def _fail(self, cause: str) -> PretrainedError:
        return PretrainedError(f"pretrained directory {self.label}: {cause}")

    # -- checks ---------------------------------------------------------------------------------

    def check(self, max_length: int | None = None) -> None:
        """Every check that needs no model built: files, pickles, weights against config.json,
        the tokenizer against the vocabulary, `max_length` against the positions."""
        if not self.path.is_dir():
            raise self._fail("does not exist (or is not a directory)")
        if pickled := sorted(p.name for p in self.path.iterdir() if p.suffix in PICKLED_SUFFIXES):
            raise self._fail(
                f"holds pickled weights ({', '.join(pickled)}), which are never loaded: unpickling runs "
                "code. Save the model as safetensors (`model.save_pretrained(dir)` does by default) "
                "and remove the pickled files"
            )
        if not (self.path / CONFIG).is_file():
            raise self._fail(f"has no {CONFIG}: not a Hugging Face format directory")
        if not self.weight_files:
            raise self._fail(f"has no weights: expected {WEIGHTS} (or shards listed in {WEIGHTS_INDEX})")
        if not (self.path / TOKENIZER).is_file():
            raise self._fail(
                f"has no {TOKENIZER}: the tokenizer must be saved with it (`tokenizer.save_pretrained(dir)` "
                "of a fast tokenizer); a fitted tokenizer would not know the encoder's vocabulary"
            )
        self._check_weights_fit_config()
        self._check_vocabulary()
        positions = self.config.get("max_position_embeddings")
        if max_length is not None and isinstance(positions, int) and max_length > positions:
            raise self._fail(
                f"its encoder reads at most {positions} positions (config.json max_position_embeddings), "
                f"features.text max_length is {max_length}; lower max_length"
            )

    @cached_property
    def config(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / CONFIG).read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError) as exc:
            raise self._fail(f"{CONFIG} cannot be read: {exc}") from None

    @cached_property
    def weight_files(self) -> list[Path]:
        if (self.path / WEIGHTS).is_file():
            return [self.path / WEIGHTS]
        index = self.path / WEIGHTS_INDEX
        if not index.is_file():
            return []
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise self._fail(f"{WEIGHTS_INDEX} cannot be read: {exc}") from None
        if missing := [s for s in shards if not (self.path / s).is_file()]:
            raise self._fail(f"{WEIGHTS_INDEX} lists shards that are not there: {', '.join(missing)}")
        return [self.path / s for s in shards]

    def weight_shapes(self) -> dict[str, list[int]]:
        """Every tensor's name and shape, from the safetensors headers (no tensor is read)."""
        from safetensors import safe_open

        shapes: dict[str, list[int]] = {}
        for file in self.weight_files:
            try:
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():  # noqa: SIM118  (a safetensors handle, not a dict)
                        shapes[name] = list(handle.get_slice(name).get_shape())
            except Exception as exc:  # a truncated or foreign file: safetensors' own error, named
                raise self._fail(f"{file.name} is not a readable safetensors file: {exc}") from None
        return shapes

    def _check_weights_fit_config(self) -> None:
        """The weights are those of the architecture config.json describes: every tensor of that
        encoder present with its shape (an encoder saved inside a task model, `bert.` prefixes
        and a head beside it, is fine: `from_pretrained` strips the prefix, ignores the head)."""
        import torch
        from transformers import AutoConfig, AutoModel

        try:
            config = AutoConfig.from_pretrained(str(self.path), local_files_only=True)
        except Exception as exc:  # an unknown model_type, a malformed config: transformers' words
            raise self._fail(f"{CONFIG} does not describe a model transformers can build: {exc}") from None
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            encoder = AutoModel.from_config(config)
        expected = {k: list(v.shape) for k, v in encoder.state_dict().items()}
        prefix = f"{encoder.base_model_prefix}."
        stored = {k.removeprefix(prefix): v for k, v in self.weight_shapes().items()}
        # The pooler is never read (the head takes the [CLS] state): a directory this package
        # registered has none.
        missing = [k for k in expected if k not in stored and not k.startswith("pooler.")]
        different = [k for k in expected if k in stored and stored[k] != expected[k]]
        if different:
            key = different[0]
            raise self._fail(
                f"its weights are not those of the architecture in {CONFIG} ({config.model_type}): "
                f"{len(different)} tensor(s) of another shape, e.g. {key} is {stored[key]} in the weights "
                f"and {expected[key]} by {CONFIG}"
            )
        if missing:
            raise self._fail(
                f"its weights are not those of the architecture in {CONFIG} ({config.model_type}): "
                f"{len(missing)} of its {len(expected)} tensors are missing, e.g. {', '.join(missing[:3])}"
            )

    @cached_property
    def tokenizer_config(self) -> dict[str, Any]:
        path = self.path / TOKENIZER_CONFIG
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError) as exc:
            raise self._fail(f"{TOKENIZER_CONFIG} cannot be read: {exc}") from None

    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(self.path / TOKENIZER))
        except Exception as exc:
            raise self._fail(f"{TOKENIZER} cannot be read by the tokenizers library: {exc}") from None

    def _check_vocabulary(self) -> None:
        tokenizer = self.tokenizer()
        tokens = tokenizer.get_vocab_size(with_added_tokens=True)
        vocab = self.config.get("vocab_size")
        if isinstance(vocab, int) and tokens > vocab:
            raise self._fail(
                f"its tokenizer has {tokens} tokens but the encoder embeds {vocab} ({CONFIG} vocab_size): "
                "the tokenizer is not this model's"
            )
        self.special_ids(tokenizer)  # names a missing pad or separator token

    def special_ids(self, tokenizer: Any) -> dict[str, int | None]:
        """The ids of the special tokens the input row needs in `tokenizer` (this directory's,
        read by `tokenizer()`): padding, [CLS]-like start, separator."""
        declared = self.tokenizer_config
        ids: dict[str, int | None] = {}
        for role, fallbacks in (
            ("pad", ["[PAD]", "<pad>"]),
            ("cls", ["[CLS]", "<s>"]),
            ("sep", ["[SEP]", "</s>"]),
            ("unk", ["[UNK]", "<unk>"]),
        ):
            name = declared.get(f"{role}_token")
            if isinstance(name, dict):  # an AddedToken written out
                name = name.get("content")
            candidates = [name] if name else fallbacks
            ids[role] = next(
                (i for i in (tokenizer.token_to_id(c) for c in candidates if c) if i is not None), None
            )
            if ids[role] is None and role != "unk":
                raise self._fail(
                    f"its tokenizer has no {role} token ({TOKENIZER_CONFIG} {role}_token, or one of "
                    f"{', '.join(fallbacks)})"
                )
        return ids

    def text_input(self, name: str, columns: list[str], max_length: int) -> dict[str, Any]:
        """The model's one text input read with this directory's tokenizer (as
        runtime.data.text.fitted_input describes a fitted one): its own post-processor (the
        model's convention for a pair), truncated to `max_length`, padded by the job."""
        tokenizer = self.tokenizer()
        ids = self.special_ids(tokenizer)
        if tokenizer.post_processor is None:
            from tokenizers import processors

            cls, sep = tokenizer.id_to_token(ids["cls"]), tokenizer.id_to_token(ids["sep"])
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{cls} $A {sep}",
                pair=f"{cls} $A {sep} $B:1 {sep}:1",
                special_tokens=[(cls, ids["cls"]), (sep, ids["sep"])],
            )
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length, strategy="longest_first")
        document = tokenizer.to_str()
        return {
            "name": name,
            "columns": columns,
            "kind": "pretrained",
            "max_length": max_length,
            "vocab_size": int(
                self.config.get("vocab_size") or tokenizer.get_vocab_size(with_added_tokens=True)
            ),
            "pad_id": ids["pad"],
            "unk_id": ids["unk"],
            "cls_id": ids["cls"],
            "sep_id": ids["sep"],
            "tokenizer": document,
            "tokenizer_sha256": hashlib.sha256(document.encode()).hexdigest(),
        }

    # -- identity -------------------------------------------------------------------------------

    def files(self) -> list[Path]:
        """What is read of it: the config, the weights, the tokenizer files (and a registered
        model's head)."""
        names = [CONFIG, *TOKENIZER_FILES, HEAD, HEAD_CONFIG]
        found = [self.path / n for n in names if (self.path / n).is_file()]
        if (self.path / WEIGHTS_INDEX).is_file():
            found.append(self.path / WEIGHTS_INDEX)
        return sorted({*found, *self.weight_files})

    def file_digests(self) -> dict[str, str]:
        """Each file's sha256, by its name in the directory."""
        return {p.relative_to(self.path).as_posix(): file_sha256(p) for p in self.files()}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def directory_sha256(digests: dict[str, str]) -> str:
    """One digest of a directory's files: their names and contents, in name order."""
    digest = hashlib.sha256()
    for name in sorted(digests):
        digest.update(f"{name}\0{digests[name]}\n".encode())
    return digest.hexdigest()
