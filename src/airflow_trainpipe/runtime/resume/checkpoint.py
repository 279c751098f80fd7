"""Checkpoints of a training run: saved atomically, pruned, verified, and resumed from.

Layout under the run-scoped root `<checkpoint.uri>/<pipeline>/<run_id>/checkpoints/`:

    step_000000200/          DeepSpeed's files for step 200 (every rank's shards)
    step_000000200/COMPLETE.json   written last: step, world size, sha256 of every file
    best.json                which complete checkpoint scored best (validation split, or holdout)

A checkpoint counts only once COMPLETE.json exists, and it is written only after every rank's
files are on the destination, so a crash at any point leaves either a complete checkpoint or
one that the next attempt skips (with a warning that names it).

With `compression: zstd` the destination holds `<file>.zst` only; the marker's size and sha256
are the stored (compressed) file's, and it records `"compression": "zstd"` (a marker without the
field is an uncompressed checkpoint). A resume unpacks it into a node-local directory that
DeepSpeed loads from, never over the files that were just verified.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.contracts.events import emit
from airflow_trainpipe.core.digest import sha256_of
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.core.storage import filesystem, is_local, join, node_local_dir, node_scratch_dir
from airflow_trainpipe.runtime.resume.compression import SUFFIX, compress_file, decompress_file
from airflow_trainpipe.runtime.resume.faults import fault_point

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
BEST = "best.json"
READ_ATTEMPTS = 4
READ_BACKOFF_S = 0.5  # doubled after each failed read: 0.5 + 1 + 2 s before giving up


class CheckpointError(TrainpipeError):
    """A checkpoint could not be written, read, converted or loaded; the message names it."""

    retryable = True  # a store that comes back; the next try resumes from the newest complete one


_TAG = re.compile(r"^step_(\d{9})$")


def tag_for(step: int) -> str:
    return f"step_{step:09d}"


def parameter_layout(module: Any) -> str:
    """What a checkpoint's optimizer state is laid out by: the engine's parameters, their names and
    shapes in order (a digest, kept in the marker). The model states keep transformers' names
    whatever `training.speed.fused_qkv` does to the engine's module; the optimizer's flat copies
    follow the module's own parameters and would load into another layout without an error."""
    digest = hashlib.sha256()
    for name, parameter in module.named_parameters():
        digest.update(f"{name}:{tuple(getattr(parameter, 'ds_shape', parameter.shape))};".encode())
    return "sha256:" + digest.hexdigest()[:16]


def refuse_other_layout(checkpoint: CompleteCheckpoint, layout: str) -> None:
    """Before DeepSpeed loads it: a checkpoint saved by other parameters (a marker from before the
    layout was recorded is taken as it is)."""
    saved = checkpoint.marker.get("parameter_layout")
    if saved is not None and saved != layout:
        error = CheckpointError(
            f"checkpoint {checkpoint.uri} was saved by a model whose parameters are laid out otherwise "
            "(training.speed.fused_qkv, or the model itself, changed since): its optimizer state "
            "does not fit this one; resume with the config it was saved with, or train under a new run id"
        )
        error.retryable = False  # a retry would meet the same checkpoint
        raise error


def data_identity(data_files: list[str]) -> str:
    """What a run trains on, as its checkpoints' markers record it: a digest of its file list.
    Not the snapshot's digest: the same files named by `--data` and by `--snapshot` are the same
    data, and a snapshot's files are content-addressed (other bytes are other names). Bytes
    changed under one name are the reader's to catch (runtime/data/reader.py)."""
    return "files:" + hashlib.sha256("\n".join(data_files).encode()).hexdigest()[:16]


def refuse_other_data(checkpoint: CompleteCheckpoint, identity: str, run_dir: str) -> None:
    """Before anything is built or logged: a checkpoint of the run saved while training on other
    data (the same run id given another day, or a snapshot frozen again). Resuming would go on
    with the old weights on the new rows and write the new data's lineage into the old run; a
    marker from before the data was recorded is taken as it is."""
    saved = checkpoint.marker.get("data")
    if saved is not None and saved != identity:
        error = CheckpointError(
            f"run directory {run_dir} holds checkpoints of this run id trained on data {saved}, "
            f"and this job reads {identity} (other files: another --ds or snapshot): "
            "train under a new run id, or delete that directory to train this run afresh"
        )
        error.retryable = False  # a retry would meet the same checkpoint
        raise error


@dataclass(frozen=True)
class CompleteCheckpoint:
    tag: str
    uri: str
    marker: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.marker["step"])

    @property
    def world_size(self) -> int:
        return int(self.marker["world_size"])

    @property
    def compression(self) -> str:
        return str(self.marker.get("compression", "none"))  # markers from before compression existed


@dataclass
class _PendingSave:
    tag: str
    step: int
    metric: float | None
    extra: dict[str, Any]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def ready(self) -> bool:
        return self.thread is None or not self.thread.is_alive()


class CheckpointManager:
    """Owns `training.checkpoint`: when to save, where, how many to keep, what to resume from."""

    def __init__(
        self,
        cfg: CheckpointSection,
        run_dir: str,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        higher_is_better: bool,
        group: Any = None,
    ):
        """`group`: the host group its barriers and gathers run on (runtime/collectives.py)."""
        self.cfg = cfg
        self.group = group
        self.root = join(run_dir, "checkpoints")
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.higher_is_better = higher_is_better
        self.remote = not is_local(self.root)
        # DeepSpeed writes to a local directory. A local destination is written in place; a
        # remote one is staged on this node's disk and uploaded from there.
        self.staging = node_local_dir(self.root, "staging")
        self._fs, self._root_path = filesystem(self.root)
        self._local_fs = filesystem(self.staging.as_uri())[0]
        # Where a compressed checkpoint is unpacked for DeepSpeed: beside the staged files of a
        # remote store; for a local destination, a node-local directory outside it.
        self.unpacked = self.staging if self.remote else node_scratch_dir(self.root, "unpacked")
        self._pending: _PendingSave | None = None
        self._last_save_time = time.monotonic()
        self.last_saved_step: int | None = None

    # -- when ---------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """This rank's view; the caller all-reduces it because clocks differ between ranks."""
        if self.cfg.every_steps and step % self.cfg.every_steps == 0:
            return True
        minutes = self.cfg.every_minutes
        return minutes is not None and minutes > 0 and time.monotonic() - self._last_save_time >= minutes * 60

    def pending_ready(self) -> bool:
        """True when this rank's part of the last save is hashed (and uploaded)."""
        return self._pending is not None and self._pending.ready()

    # -- save ---------------------------------------------------------------------------------

    def save(
        self,
        engine: Any,
        step: int,
        client_state: dict[str, Any],
        *,
        metric: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Collective: every rank calls it at the same step."""
        self.complete_pending()  # one save in flight at a time keeps ordering and disk bounded
        tag = tag_for(step)
        self.staging.mkdir(parents=True, exist_ok=True)
        engine.save_checkpoint(str(self.staging), tag=tag, client_state=client_state, save_latest=False)
        dist.barrier(group=self.group)
        fault_point("save", step)
        pending = _PendingSave(tag, step, metric, extra or {})
        if self.local_rank == 0:
            # Hashing and uploading run beside the training loop; the marker waits for them.
            pending.thread = threading.Thread(
                target=self._hash_and_upload, args=(pending,), name=f"checkpoint-{tag}", daemon=True
            )
            pending.thread.start()
        self._pending = pending
        self._last_save_time = time.monotonic()
        self.last_saved_step = step
        if not (self.remote and self.cfg.async_upload):
            self.complete_pending()

    def _hash_and_upload(self, pending: _PendingSave) -> None:
        compress = self.cfg.compression == "zstd"
        if compress and not self.remote and self.rank != 0:
            # A local destination shared by several nodes (a ReadWriteMany volume) holds every
            # node's files: two nodes compressing and deleting the same file would race.
            return
        try:
            directory = self.staging / pending.tag
            # A .zst already there was left by an attempt killed while compressing: not this save's.
            originals = sorted(
                p for p in directory.rglob("*") if p.is_file() and p.name != MARKER and p.suffix != SUFFIX
            )
            for path in originals:
                stored, meta = self._store(path, compress)
                relative = stored.relative_to(directory).as_posix()
                pending.files[relative] = meta
                if self.remote:
                    self._fs.put_file(str(stored), f"{self._root_path}/{pending.tag}/{relative}")
                if compress:
                    # A local destination keeps only the compressed file; a remote one's staging
                    # keeps the original (as uncompressed staging does) and drops the upload copy.
                    (stored if self.remote else path).unlink()
        except BaseException as exc:  # surfaced on the training thread by complete_pending()
            pending.error = exc

    def _store(self, path: Path, compress: bool) -> tuple[Path, dict[str, Any]]:
        """The file to put on the destination, under its own name, and its entry in the marker."""
        if not compress:
            return path, {"size": path.stat().st_size, "sha256": sha256_of(self._local_fs, str(path))}
        stored = path.with_name(path.name + SUFFIX)
        size, digest = compress_file(path, stored)
        return stored, {"size": size, "sha256": digest, "uncompressed_size": path.stat().st_size}

    def complete_pending(self) -> None:
        """Collective: wait for every node's files, then write the marker (rank 0)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.thread is not None:
            pending.thread.join()
        if pending.error is not None:
            raise CheckpointError(
                f"checkpoint {join(self.root, pending.tag)} could not be written: {pending.error}"
            ) from pending.error
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, pending.files if self.local_rank == 0 else {}, group=self.group)
        if self.rank == 0:
            files: dict[str, Any] = {}
            for part in gathered:
                files.update(part)
            marker = {
                "tag": pending.tag,
                "step": pending.step,
                "world_size": self.world_size,
                "metric": pending.metric,
                "created_at": time.time(),
                "compression": self.cfg.compression,
                "files": files,
                **pending.extra,
            }
            self._write_json(f"{pending.tag}/{MARKER}", marker)
            log.info("checkpoint %s complete (%d files)", join(self.root, pending.tag), len(files))
            emit("checkpoint", step=pending.step, uri=join(self.root, pending.tag), metric=pending.metric)
            if pending.metric is not None and self.cfg.keep_best:
                self._update_best(pending.tag, pending.metric)
            self._prune()
        dist.barrier(group=self.group)

    def _write_json(self, relative: str, payload: dict[str, Any]) -> None:
        text = json.dumps(payload, indent=1, sort_keys=True)
        target = f"{self._root_path}/{relative}"
        if self.remote:
            self._fs.pipe_file(target, text.encode())  # an object PUT is atomic
        else:
            tmp = Path(target + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, target)  # readers see the old file or the whole new one

    def _read_json(self, relative: str) -> dict[str, Any] | None:
        """The JSON file, or None when it does not exist or is not JSON (a torn write).

        A read that fails (a network error, a throttled object store) says nothing about the
        file: taking it for "no marker" would let pruning delete a complete checkpoint and let
        `best.json` be overwritten. Such reads are retried, then fail the job loudly.
        """
        uri = join(self.root, relative)
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                text = self._fs.cat_file(f"{self._root_path}/{relative}")
                break
            except FileNotFoundError:
                return None
            except Exception as exc:  # s3fs raises botocore's own errors, not only OSError
                if attempt == READ_ATTEMPTS:
                    raise CheckpointError(
                        f"cannot read {uri} ({READ_ATTEMPTS} attempts): {type(exc).__name__}: {exc}; "
                        "nothing was pruned, a retry of the task resumes from the newest complete checkpoint"
                    ) from exc
                log.warning(
                    "reading %s failed (attempt %d of %d), retrying: %s", uri, attempt, READ_ATTEMPTS, exc
                )
                time.sleep(READ_BACKOFF_S * 2 ** (attempt - 1))
        try:
            return json.loads(text)
        except ValueError as exc:
            log.warning("ignoring %s, which is not JSON (a torn write): %s", uri, exc)
            return None

    def _update_best(self, tag: str, metric: float) -> None:
        best = self._read_json(BEST)
        if best is None or (metric > best["metric"] if self.higher_is_better else metric < best["metric"]):
            self._write_json(BEST, {"tag": tag, "metric": metric})

    def _tags(self) -> list[str]:
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self._fs.ls(self._root_path, detail=False)]
        except FileNotFoundError:
            return []
        return sorted((n for n in names if _TAG.match(n)), reverse=True)

    def _prune(self) -> None:
        best = (self._read_json(BEST) or {}).get("tag") if self.cfg.keep_best else None
        complete = [t for t in self._tags() if self._read_json(f"{t}/{MARKER}") is not None]
        keep = set(complete[: self.cfg.keep_last]) | ({best} if best else set())
        newest = complete[0] if complete else None
        for tag in self._tags():
            # Older partial checkpoints (left by killed attempts) can never be resumed: drop them too.
            if tag in keep or (tag not in complete and newest is not None and tag > newest):
                continue
            # Marker first: a half-deleted checkpoint must never look complete.
            for relative in (f"{tag}/{MARKER}", f"{tag}"):
                path = f"{self._root_path}/{relative}"
                if self._fs.exists(path):
                    self._fs.rm(path, recursive=True)
            # This node's copies: unpacked (compressed), converted (universal) and, for a remote
            # store, staged: there `unpacked` is the staging directory itself. (For a local one
            # the staged directory is the checkpoint, removed above.)
            for copy in (
                self.staging / f"{tag}_universal",
                self.unpacked / tag,
                self.unpacked / f"{tag}_universal",
            ):
                shutil.rmtree(copy, ignore_errors=True)

    # -- resume -------------------------------------------------------------------------------

    def latest_complete(self) -> CompleteCheckpoint | None:
        """Newest checkpoint with a marker and intact files; partial or corrupt ones are skipped."""
        for tag in self._tags():
            checkpoint, kind, problem = self._intact(tag)
            if checkpoint is not None:
                return checkpoint
            log.warning("skipping %s checkpoint %s: %s", kind, join(self.root, tag), problem)
        return None

    def complete_at(self, step: int) -> CompleteCheckpoint:
        """The complete, intact checkpoint of `step`; CheckpointError when there is none."""
        tag = tag_for(step)
        checkpoint, kind, problem = self._intact(tag)
        if checkpoint is None:
            raise CheckpointError(f"{kind} checkpoint {join(self.root, tag)} cannot be loaded: {problem}")
        return checkpoint

    def _intact(self, tag: str) -> tuple[CompleteCheckpoint | None, str, str]:
        """(the checkpoint, "", "") when its marker exists and every file matches it; else (None,
        `partial` or `corrupt`, why)."""
        marker = self._read_json(f"{tag}/{MARKER}")
        if marker is None:
            return None, "partial", f"no {MARKER} (the attempt that wrote it died)"
        problem = self._verify(tag, marker)
        if problem:
            return None, "corrupt", problem
        return CompleteCheckpoint(tag, join(self.root, tag), marker), "", ""

    def _verify(self, tag: str, marker: dict[str, Any]) -> str | None:
        for relative, meta in sorted(marker["files"].items()):
            path = f"{self._root_path}/{tag}/{relative}"
            try:
                size = self._fs.size(path)
            except FileNotFoundError:
                return f"{relative} is missing"
            if size != meta["size"]:
                return f"{relative} has {size} bytes, the marker says {meta['size']}"
            digest = sha256_of(self._fs, path)
            if digest != meta["sha256"]:
                return (
                    f"{relative} sha256 {digest[:12]}... does not match the marker's {meta['sha256'][:12]}..."
                )
        return None

    def _loadable(self, checkpoint: CompleteCheckpoint) -> Path:
        """The directory on this node that DeepSpeed loads the checkpoint (and its conversion) from."""
        return self.staging if checkpoint.compression == "none" else self.unpacked

    def fetch(self, checkpoint: CompleteCheckpoint) -> tuple[str, str]:
        """Collective: make the checkpoint loadable on this node. Returns (directory, tag) for DeepSpeed."""
        if self.local_rank == 0:
            if checkpoint.compression != "none":
                self._unpack(checkpoint)
            elif self.remote:
                target = self.staging / checkpoint.tag
                shutil.rmtree(target, ignore_errors=True)
                self._fs.get(f"{self._root_path}/{checkpoint.tag}/", str(target), recursive=True)
        dist.barrier(group=self.group)
        return str(self._loadable(checkpoint)), checkpoint.tag

    def _unpack(self, checkpoint: CompleteCheckpoint) -> None:
        """Decompress every stored file, straight from the store, into a scratch directory that
        replaces the loadable one only once whole."""
        target = self._loadable(checkpoint) / checkpoint.tag
        scratch = target.with_name(f"{checkpoint.tag}.unpacking")
        shutil.rmtree(scratch, ignore_errors=True)
        for relative, meta in sorted(checkpoint.marker["files"].items()):
            out = scratch / relative.removesuffix(SUFFIX)
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                with self._fs.open(f"{self._root_path}/{checkpoint.tag}/{relative}", "rb") as source:
                    decompress_file(source, out, meta["uncompressed_size"])
            except Exception as exc:  # zstandard's ZstdError, a short frame, a store that failed
                raise CheckpointError(
                    f"cannot decompress {relative} of checkpoint {checkpoint.uri}: {type(exc).__name__}: {exc}"
                ) from exc
        shutil.rmtree(target, ignore_errors=True)
        os.replace(scratch, target)

    def to_universal(self, checkpoint: CompleteCheckpoint) -> str:
        """Collective: convert to a DeepSpeed universal checkpoint (for another world size)."""
        universal = f"{checkpoint.tag}_universal"
        loadable = self._loadable(checkpoint)
        target = loadable / universal
        if self.local_rank == 0 and not (target / MARKER).exists():
            scratch = loadable / f"{universal}.tmp"
            shutil.rmtree(scratch, ignore_errors=True)
            # Through safe_load's runner: the converter torch.loads every shard, weights-only.
            command = [
                sys.executable,
                "-m",
                "airflow_trainpipe.runtime.resume.safe_load",
                "deepspeed.checkpoint.ds_to_universal",
                "--input_folder",
                str(loadable / checkpoint.tag),
                "--output_folder",
                str(scratch),
                "--inject_missing_state",
                "--num_extract_workers",
                "1",
                "--num_merge_workers",
                "1",
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise CheckpointError(
                    f"converting {checkpoint.uri} to a universal checkpoint failed:\n{done.stderr[-4000:]}"
                )
            (scratch / MARKER).write_text(json.dumps(checkpoint.marker))
            shutil.rmtree(target, ignore_errors=True)
            os.replace(scratch, target)
        dist.barrier(group=self.group)
        return universal
