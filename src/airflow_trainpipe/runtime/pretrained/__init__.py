"""Pretrained weights (`training.pretrained`): where they come from, what a directory must hold,
and the Hugging Face directory a fine-tuned model is registered as.

- `source`: a configured URI (a path, `s3://`, `models:/NAME/VERSION` or `@ALIAS`) pinned once per
  run to exact bytes (their sha256), fetched onto each node and verified there;
- `directory`: the checks that fail a run before any step (missing, partial, pickled, another
  architecture, a vocabulary its tokenizer does not match) and the tokenizer as a fitted text input;
- `export`: the consolidated model as one directory that `transformers` loads directly.
"""
