"""Fine-tuning a pretrained encoder (issue 39), measured side by side in one run:

- memory: what each rank holds of a ~100M-parameter encoder's model state (parameters, gradients,
  optimizer state: every tensor reachable from the engine, counted once by storage) and its peak
  RSS, on 2 CPU ranks under ZeRO-1, ZeRO-2, ZeRO-3 and ZeRO-3 + CPU offload of both;
- throughput: our training step (StepRunner over BlockStream, as the job steps) vs a plain Hugging
  Face `Trainer` given the same DeepSpeed config, on the same model (the text_encoder over the
  same pretrained directory), rows, batch, ranks and steps; and vs a bare DeepSpeed loop;
- export: the consolidated Hugging Face directory (safetensors) vs the DeepSpeed checkpoint of
  the same engine: save time, load time, bytes.

Every side builds the model as the job does: inside `model_construction` (ZeRO-3: partitioned as
built, the pretrained weights loaded a layer at a time). `--gpu` runs the throughput part on a
GPU (bf16, nccl, the ~100M encoder) with MFU. `python benchmarks/pretrained_bench.py` prints the
tables; `make bench ONLY=pretrained` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
ENCODER_100M = {"hidden_size": 768, "layers": 14, "heads": 12, "intermediate_size": 3072}
ENCODER_SMALL = {"hidden_size": 256, "layers": 4, "heads": 4, "intermediate_size": 1024}
# Dense bf16 tensor-core peaks from the vendor's data sheets (without sparsity), by device name.
PEAK_BF16 = {"H100 80GB HBM3": 989e12, "H100 PCIe": 756e12, "H200": 989e12, "A100": 312e12}


# -- the pipeline ---------------------------------------------------------------------------------


def make_data(folder: Path, rows: int) -> list[str]:
    from airflow_trainpipe.examples.synthetic import write_day

    files: list[str] = []
    for day in range(max(1, rows // 20_000)):
        files += write_day(
            folder.as_uri(), date(2026, 1, 1 + day), min(rows, 20_000), seed=day, kind="support_tickets"
        )
    return files


def make_encoder(folder: Path, files: list[str], shape: dict[str, int]) -> Path:
    import pyarrow.parquet as pq

    from airflow_trainpipe.examples.encoder_directory import save_encoder_directory

    table = pq.read_table(files[0].removeprefix("file://"), columns=["subject", "body"])
    texts = [f"{s} {b}" for s, b in zip(table["subject"].to_pylist(), table["body"].to_pylist(), strict=True)]
    return save_encoder_directory(
        folder, texts, vocab_size=800, hidden_size=shape["hidden_size"], layers=shape["layers"],
        heads=shape["heads"], intermediate_size=shape["intermediate_size"], positions=128, seed=1,
        dropout=0.1,
    )  # fmt: skip


def config_text(tmp: Path, encoder: Path, zero: str, batch: int, gpu: bool) -> str:
    """support_tickets reading its text only (the Trainer's side has no tabular path), fine-tuning
    `encoder`; `zero`: `1`, `2`, `3` or `3+offload`."""
    config = yaml.safe_load((REPO / "dags/configs/support_tickets.yaml").read_text())
    config["data"]["features"] = {"text": ["subject", "body"]}
    config["features"] = {"text": {"subject": {"max_length": 96}, "body": {"pair_with": "subject"}}}
    config["evaluation"] = {}
    config["gate"].pop("slice_guardrail", None)
    training = config["training"]
    training["pretrained"] = encoder.as_uri()
    training["checkpoint"].update(uri=(tmp / "ckpt").as_uri(), every_steps=100_000)
    training["hyperparameters"].update(
        epochs=1000,
        batch_size=batch,
        learning_rate=5e-5,
        model_args={"dropout": 0.1, "head_hidden_sizes": [256]},
    )
    stage = int(zero[0])
    deepspeed: dict[str, Any] = {"zero_stage": stage}
    if zero.endswith("offload"):
        deepspeed.update(offload_optimizer="cpu", offload_params="cpu")
    training["deepspeed"] = deepspeed
    training["resources"] = (
        {"gpus_per_node": 1, "processes_per_node": 1} if gpu else {"processes_per_node": 2}
    )
    return yaml.safe_dump(config, sort_keys=False)


def spec_file(tmp: Path, files: list[str], encoder: Path, zero: str, batch: int, gpu: bool) -> Path:
    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec

    name = f"z{zero}_b{batch}".replace("+", "_")
    spec = TrainSpec(
        config=parse_config(config_text(tmp, encoder, zero, batch, gpu)), run_id=name, data_files=files
    )
    path = tmp / f"spec_{name}.json"
    path.write_text(spec.to_json())
    return path


def torchrun(nproc: int, *args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args,
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{args[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return done.stdout


def tagged(out: str, tag: str) -> Any:
    return json.loads(out.split(f"{tag} ", 1)[1].splitlines()[0])


# -- the workers (under torchrun) -------------------------------------------------------------------


class _Job:
    """What every worker sets up as the training job does: the process group, the fit with the
    directory's tokenizer, the model built inside `model_construction`, the rows in memory."""

    def __init__(self, spec_path: str, rows: int = 4096):
        import torch

        from airflow_trainpipe.contracts.train_spec import TrainSpec

        spec = TrainSpec.from_json(Path(spec_path).read_text())
        self.spec, self.hp = spec, spec.hyperparameters
        self.on_gpu = torch.cuda.is_available() and spec.config.training.resources.gpus_per_node > 0
        if not self.on_gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        import torch.distributed as dist

        from airflow_trainpipe.core.storage import local_path
        from airflow_trainpipe.runtime.data.blocks import BlockReader
        from airflow_trainpipe.runtime.data.prepare import fit
        from airflow_trainpipe.runtime.data.reader import data_columns
        from airflow_trainpipe.runtime.data.tokens import BlockEncoder
        from airflow_trainpipe.runtime.engine import compute_dtype, deepspeed_config
        from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory

        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = (
            torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if self.on_gpu else torch.device("cpu")
        )
        if self.on_gpu:
            torch.cuda.set_device(self.device)
        torch.manual_seed(self.hp.seed)
        uri = spec.config.training.pretrained
        assert uri is not None
        self.directory = PretrainedDirectory(local_path(uri), uri)
        data = spec.config.data
        prepared = fit(
            spec.data_files, data, spec.config.features, spec.config.training.task, pretrained=self.directory
        )
        self.transform = prepared.transform
        reader = BlockReader(spec.data_files, prepared.identities, data, data_columns(data))
        encoder = BlockEncoder(reader, self.transform, prepared.key)
        import numpy as np

        sides = [encoder.side(block, "train") for block in prepared.blocks[:4]]
        self.x = torch.from_numpy(np.concatenate([f for _, f in sides])[:rows])
        self.y = torch.from_numpy(np.concatenate([self.transform.labels(t) for t, _ in sides])[:rows]).long()
        self.global_batch = self.hp.batch_size * self.world
        self.ds_config = deepspeed_config(
            spec, self.global_batch, self.world, universal=False, on_gpu=self.on_gpu
        )
        self.dtype = compute_dtype(self.ds_config)

    def model(self) -> Any:
        from airflow_trainpipe.runtime.engine import model_construction
        from airflow_trainpipe.runtime.models import build_model
        from airflow_trainpipe.runtime.models.inputs import ModelInputs

        with model_construction(self.ds_config):
            return build_model(
                "text_encoder", inputs=ModelInputs.of(self.transform), task="multiclass_classification",
                num_outputs=self.transform.num_outputs, pretrained=str(self.directory.path), **self.hp.model_args,
            )  # fmt: skip

    def batches(self, steps: int) -> Any:
        """This rank's micro-batches, the same sequence on every side."""
        order = __import__("torch").randperm(
            len(self.y), generator=__import__("torch").Generator().manual_seed(7)
        )
        for step in range(steps):
            start = (step * self.global_batch) % (
                len(self.y) - self.global_batch
            ) + self.rank * self.hp.batch_size
            index = order[start : start + self.hp.batch_size]
            yield self.x[index], self.y[index]


def _held(engine: Any) -> dict[str, float]:
    """MiB of model state this rank holds, by part: the parameters (ZeRO-3: this rank's shards),
    the optimizer's master copies (the tensors its inner torch optimizer steps: ZeRO's fp32
    partitions) when they are not the parameters themselves, and the Adam moments. Counted per
    tensor (views into one flat buffer each count their own elements), each tensor once.
    Gradients and communication buckets are transient and left out."""
    seen: list[tuple[int, int]] = []  # (first byte, end) of every tensor counted

    def size(tensor: Any) -> float:
        # Bytes not yet counted: a master partition that is the parameters' own flat buffer
        # (fp32 training: ZeRO-3's `.float()` of an fp32 buffer is that buffer) counts nothing.
        if tensor.numel() == 0:
            return 0.0
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        overlap = sum(max(0, min(end, e) - max(start, b)) for b, e in seen)
        seen.append((start, end))
        return (end - start - overlap) / 2**20

    parameters = sum(size(getattr(p, "ds_tensor", p)) for p in engine.module.parameters())
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    masters = sum(size(p) for group in inner.param_groups for p in group["params"])
    moments = sum(
        size(t)
        for state in inner.state.values()
        for t in state.values()
        if hasattr(t, "data_ptr") and t.dim() > 0
    )
    devices = sorted(
        {
            str(t.device.type)
            for state in inner.state.values()
            for t in state.values()
            if hasattr(t, "device") and t.dim() > 0
        }
    )
    return {
        "parameters": round(parameters, 1),
        "masters": round(masters, 1),
        "moments": round(moments, 1),
        "total": round(parameters + masters + moments, 1),
        "optimizer_on": ",".join(devices),
    }


def _peak_rss_mib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _memory_worker(spec_path: str, steps: int, export_dir: str = "") -> None:
    """A few real steps, then what each rank holds; with `export_dir`, the export vs the checkpoint."""
    import torch
    import torch.distributed as dist

    from airflow_trainpipe.runtime.engine import build_engine

    baseline = _peak_rss_mib()
    job = _Job(spec_path, rows=512)
    engine = build_engine(job.model(), job.spec, job.ds_config)
    loss_fn = torch.nn.CrossEntropyLoss()
    engine.train()
    for x, y in job.batches(steps):
        engine.backward(loss_fn(engine(x.to(job.device)), y.to(job.device)))
        engine.step()
    found = {"held_mib": _held(engine), "peak_rss_mib": _peak_rss_mib(), "rss_before_mib": baseline}
    gathered: list[Any] = [None] * job.world
    dist.all_gather_object(gathered, found)
    if job.rank == 0:
        print("MEMORY " + json.dumps(gathered), flush=True)
    if export_dir:
        _export(engine, job, Path(export_dir))
    dist.barrier()


def _export(engine: Any, job: _Job, root: Path) -> None:
    """The consolidated Hugging Face directory vs the DeepSpeed checkpoint of this engine."""
    import torch.distributed as dist

    from airflow_trainpipe.runtime.engine import full_state_dict
    from airflow_trainpipe.runtime.pretrained.export import save_hf_directory

    def timed(body: Any) -> float:
        dist.barrier()
        started = time.perf_counter()
        body()
        dist.barrier()
        return time.perf_counter() - started

    stage = job.spec.config.training.deepspeed.zero_stage
    checkpoint_save = timed(lambda: engine.save_checkpoint(str(root / "checkpoint"), tag="bench"))
    export: dict[str, Any] = {}

    def save_export() -> None:
        weights = full_state_dict(engine, stage)
        if job.rank == 0:
            from airflow_trainpipe.runtime.models import build_model
            from airflow_trainpipe.runtime.models.inputs import ModelInputs

            model = build_model(
                "text_encoder", inputs=ModelInputs.of(job.transform), task="multiclass_classification",
                num_outputs=job.transform.num_outputs, pretrained=str(job.directory.path), **job.hp.model_args,
            )  # fmt: skip
            model.load_state_dict(weights)
            export["model"] = model
            save_hf_directory(model, job.directory, job.transform, root / "hf")

    export_save = timed(save_export)
    checkpoint_load = timed(lambda: engine.load_checkpoint(str(root / "checkpoint"), tag="bench"))

    def load_export() -> None:
        if job.rank == 0:
            from transformers import AutoModel

            AutoModel.from_pretrained(str(root / "hf"), local_files_only=True)

    export_load = timed(load_export)
    if job.rank == 0:
        size = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())  # noqa: E731
        print(
            "EXPORT "
            + json.dumps(
                {
                    "checkpoint_save_s": checkpoint_save,
                    "checkpoint_load_s": checkpoint_load,
                    "export_save_s": export_save,
                    "export_load_s": export_load,
                    "checkpoint_mib": size(root / "checkpoint") / 2**20,
                    "export_mib": size(root / "hf") / 2**20,
                }
            ),
            flush=True,
        )


def _hf_worker(spec_path: str, steps: int, warmup: int) -> None:
    """The same model, rows, batch and DeepSpeed config through a plain `transformers.Trainer`."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    job = _Job(spec_path)
    config = json.loads(json.dumps(job.ds_config))
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-bench-"),
        per_device_train_batch_size=job.hp.batch_size,
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=job.hp.learning_rate,
        weight_decay=job.hp.weight_decay,
        lr_scheduler_type="constant",
        max_grad_norm=config["gradient_clipping"],
        bf16=job.dtype == torch.bfloat16,
        deepspeed=config,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        seed=job.hp.seed,
        dataloader_drop_last=True,
        disable_tqdm=True,
        use_cpu=not job.on_gpu,
        # The Trainer's default (fused AdamW on a GPU), or TRAINPIPE_HF_OPTIM: `adamw_torch` is
        # the torch AdamW our job steps with.
        **({"optim": os.environ["TRAINPIPE_HF_OPTIM"]} if os.environ.get("TRAINPIPE_HF_OPTIM") else {}),
    )
    network = job.model()

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.network(x)
            return {"loss": torch.nn.functional.cross_entropy(logits.float(), labels), "logits": logits}

    # Token ids as integers: the Trainer casts every floating input to the DeepSpeed dtype, and
    # bf16 holds integers exactly only up to 256 (id 799 becomes 800: out of the vocabulary).
    # Lossless here, where every column is a token id (text only).
    assert job.transform.num_dense == 0 and not job.transform.cardinalities
    rows = [
        {"x": x.long(), "labels": y} for xb, yb in job.batches(steps) for x, y in zip(xb, yb, strict=True)
    ]

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return rows[i]

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            if job.on_gpu:
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    # The rows are this rank's batches in order: no shuffling, no distributed sampler re-cut.
    trainer = Trainer(model=Classifier(), args=args, train_dataset=Rows(), callbacks=[Clock()])
    trainer._get_train_sampler = lambda *_: torch.utils.data.SequentialSampler(Rows())  # type: ignore[method-assign]
    trainer.train()
    per_step = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1 :], strict=False)]
    if job.rank == 0:
        print(
            "HF " + json.dumps({"ms_per_step": 1000 * statistics.median(per_step), "steps": len(per_step)}),
            flush=True,
        )


def _precision_worker(spec_path: str, steps: int) -> None:
    """fp32 and bf16 on one CPU rank: whether DeepSpeed's CPU path trains in bf16, and how fast."""
    import torch

    from airflow_trainpipe.runtime.engine import build_engine, deepspeed_config

    job = _Job(spec_path, rows=512)
    found = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        spec = job.spec.model_copy(
            update={
                "config": job.spec.config.model_copy(
                    update={
                        "training": job.spec.config.training.model_copy(
                            update={
                                "deepspeed": job.spec.config.training.deepspeed.model_copy(
                                    update={"precision": precision}
                                )
                            }
                        )
                    }
                )
            }
        )
        config = deepspeed_config(spec, job.global_batch, job.world, universal=False, on_gpu=False)
        engine = build_engine(job.model(), spec, config)
        losses, times = [], []
        for x, y in job.batches(steps):
            started = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            times.append(time.perf_counter() - started)
            losses.append(loss.item())
        found[precision] = {
            "ms_per_step": 1000 * statistics.median(times[2:]),
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "dtype": str(next(engine.module.parameters()).dtype),
        }
    print("PRECISION " + json.dumps(found), flush=True)


# -- the parts --------------------------------------------------------------------------------------


def memory(tmp: Path, files: list[str], encoder: Path) -> dict[str, Any]:
    found = {}
    for zero in ("1", "2", "3", "3+offload"):
        spec = spec_file(tmp, files, encoder, zero, 4, gpu=False)
        export = str(tmp / f"export_{zero[0]}") if zero == "3" else ""
        out = torchrun(2, str(Path(__file__)), "--memory-worker", str(spec), "3", export)
        found[zero] = {
            "ranks": tagged(out, "MEMORY"),
            **({"export": tagged(out, "EXPORT")} if export else {}),
        }
        print(f"memory ZeRO-{zero}: {json.dumps(found[zero])}", file=sys.stderr, flush=True)
    return found


def throughput(
    tmp: Path, files: list[str], encoder: Path, zero: str, batch: int, gpu: bool, steps: int
) -> dict[str, Any]:
    """Ours and bare (text_bench's worker: alternating blocks on one engine) and the Trainer (its
    own process, the same number of timed steps after the same warm-up)."""
    nproc = 1 if gpu else 2
    spec = spec_file(tmp, files, encoder, zero, batch, gpu)
    blocks = 6
    out = torchrun(
        nproc, str(REPO / "benchmarks/text_bench.py"), "--worker", str(spec), str(blocks), str(steps)
    )
    found = {**tagged(out, "STEP"), **(tagged(out, "FLOPS") if "FLOPS " in out else {})}
    warmup = 5
    try:
        out = torchrun(
            nproc,
            str(Path(__file__)),
            "--hf-worker",
            str(spec),
            str(warmup + blocks // 2 * steps + 1),
            str(warmup),
        )
        hf = tagged(out, "HF")
    except RuntimeError as exc:  # ours and bare stand on their own; say why the Trainer's side is missing
        print(f"HF Trainer side failed: {str(exc)[-3000:]}", file=sys.stderr, flush=True)
        hf = {"ms_per_step": float("nan"), "steps": 0}
    found.update(
        hf=hf["ms_per_step"] / 1000, hf_steps=hf["steps"], zero=zero, batch=batch, blocks=blocks, steps=steps
    )
    print(f"throughput ZeRO-{zero} b{batch}: {json.dumps(found)}", file=sys.stderr, flush=True)
    return found


def precision(tmp: Path, files: list[str], encoder: Path) -> dict[str, Any]:
    spec = spec_file(tmp, files, encoder, "1", 32, gpu=False)
    out = torchrun(1, str(Path(__file__)), "--precision-worker", str(spec), "12")
    found = tagged(out, "PRECISION")
    print(f"precision: {json.dumps(found)}", file=sys.stderr, flush=True)
    return found


def precision_lines(found: dict[str, Any], encoder: str) -> list[str]:
    fp32, bf16 = found["fp32"], found["bf16"]
    return [
        f"Precision on a CPU rank: the same fine-tune ({encoder}, ZeRO-1, batch 32, 1 rank, 12 steps) with",
        "`precision: fp32` and `precision: bf16` (DeepSpeed's CPU accelerator, bf16 parameters). Whether bf16",
        "pays depends on the cores' bf16 instructions (this machine's: "
        + (_cpu_flags() or "none found")
        + ").",
        "",
        "| precision | parameters | ms/step (median of 10) | loss step 1 | loss step 12 |",
        "|---|---|---|---|---|",
        f"| fp32 | {fp32['dtype'].removeprefix('torch.')} | {fp32['ms_per_step']:.0f} | {fp32['first_loss']:.4f} | {fp32['last_loss']:.4f} |",
        f"| bf16 | {bf16['dtype'].removeprefix('torch.')} | {bf16['ms_per_step']:.0f} | {bf16['first_loss']:.4f} | {bf16['last_loss']:.4f} |",
        "",
        f"bf16 / fp32 step time: {_ratio(bf16['ms_per_step'], fp32['ms_per_step'])}. `auto` stays fp32 on CPU ranks (the",
        "default keeps every CPU run's numbers as they were); `precision: bf16` is allowed there.",
    ]


def _cpu_flags() -> str:
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return ""
    return ", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags.split())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}"


def memory_lines(found: dict[str, Any], parameters: float) -> list[str]:
    first = max(r["held_mib"]["total"] for r in found["1"]["ranks"])
    lines = [
        f"Model state held per rank, {parameters / 1e6:.1f}M-parameter encoder (hidden 768, 14 layers), 2 CPU ranks,",
        "fp32 (DeepSpeed's CPU path), after 3 real steps of batch 4. Held: the parameters (ZeRO-3: the rank's",
        "shards), the optimizer's fp32 master partitions where they are copies, and the Adam moments, each",
        "tensor once (gradients and communication buckets are transient and left out). On CPU ranks offload",
        "moves state between two places in the same RAM: listed to show it works here, not to save memory.",
        "",
        "| ZeRO | parameters | master copies | Adam moments | model state rank 0 | rank 1 | / ZeRO-1 | peak RSS rank 0 | rank 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for zero, result in found.items():
        ranks = result["ranks"]
        held = [r["held_mib"] for r in ranks]
        lines.append(
            f"| {zero} | {held[0]['parameters']:,.0f} | {held[0]['masters']:,.0f} | {held[0]['moments']:,.0f} | "
            f"{held[0]['total']:,.0f} | {held[1]['total']:,.0f} | {_ratio(max(h['total'] for h in held), first)} | "
            f"{ranks[0]['peak_rss_mib']:,.0f} | {ranks[1]['peak_rss_mib']:,.0f} |"
        )
    return [
        *lines,
        "",
        "The model state falls with the stage (ZeRO-3 shards the parameters; in fp32 its master partitions",
        "are the parameter shards themselves, where ZeRO-1 and 2 keep a copy). The peak RSS does not: ZeRO-2's",
        "partitioned gradients lower it, ZeRO-3's raises it (its gather and prefetch buffers, and the whole",
        "safetensors file mapped on rank 0 while the layers load); offload adds pinned staging buffers. Not",
        "investigated further here.",
    ]


def export_lines(export: dict[str, float]) -> list[str]:
    return [
        "Export vs checkpoint (the ZeRO-3 run above, 2 CPU ranks): the consolidated Hugging Face directory",
        "(gathered a parameter at a time onto rank 0, saved as safetensors with config and tokenizer) vs",
        "DeepSpeed's checkpoint of the same engine (every rank's shards and optimizer state: what a resume",
        "needs, three times the weights). Export load: `AutoModel.from_pretrained` (safetensors are",
        "memory-mapped, the pages read when first touched); checkpoint load: `engine.load_checkpoint`.",
        "",
        "| | save s | load s | MiB |",
        "|---|---|---|---|",
        f"| DeepSpeed checkpoint | {export['checkpoint_save_s']:.2f} | {export['checkpoint_load_s']:.2f} | {export['checkpoint_mib']:,.0f} |",
        f"| Hugging Face export | {export['export_save_s']:.2f} | {export['export_load_s']:.2f} | {export['export_mib']:,.0f} |",
    ]


def throughput_lines(results: list[dict[str, Any]], device: str) -> list[str]:
    lines = [
        "| ZeRO | batch/rank | ours ms/step | HF Trainer ms/step | bare ms/step | ours / HF (throughput) | ours / bare (time) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['zero']} | {r['batch']} | {1000 * r['ours']:.1f} | {1000 * r['hf']:.1f} | {1000 * r['bare']:.1f} | "
            f"{_ratio(r['hf'], r['ours'])} | {_ratio(r['ours'], r['bare'])} |"
        )
    if device != "cpu" and "per_sample" in results[0]:
        peak = next((v for k, v in PEAK_BF16.items() if k in device), float("nan"))
        lines += ["", "| ZeRO | GFLOP/sample | MFU ours | MFU HF | MFU bare |", "|---|---|---|---|---|"]
        for r in results:
            flops = r["per_sample"] * r["batch"]
            mfu = {side: flops / r[side] / peak for side in ("ours", "hf", "bare")}
            lines.append(
                f"| {r['zero']} | {r['per_sample'] / 1e9:.1f} | {mfu['ours']:.1%} | {mfu['hf']:.1%} | {mfu['bare']:.1%} |"
            )
    return lines


def bench_pretrained() -> list[str]:
    tmp = Path(tempfile.mkdtemp(prefix="pretrained-bench-"))
    files = make_data(tmp / "data", 20_000)
    big = make_encoder(tmp / "encoder_100m", files, ENCODER_100M)
    small = make_encoder(tmp / "encoder_small", files, ENCODER_SMALL)
    found = memory(tmp, files, big)
    parameters = _parameters(big)
    results = [throughput(tmp, files, small, zero, 32, gpu=False, steps=10) for zero in ("1", "3")]
    precisions = precision(tmp, files, small)
    return [
        "## Pretrained encoders: ZeRO memory per rank, fine-tuning vs the HF Trainer, export",
        "",
        "Command: `make bench ONLY=pretrained` (`python benchmarks/pretrained_bench.py`).",
        "",
        *memory_lines(found, parameters),
        "",
        *export_lines(found["3"]["export"]),
        "",
        "Fine-tuning throughput, 2 CPU ranks (gloo, fp32), the support_tickets text (subject+body, at most",
        f"96 tokens, dynamic padding) on a {_parameters(small) / 1e6:.1f}M encoder (hidden 256, 4 layers): ours = StepRunner over",
        "BlockStream with the token cache; bare = a DeepSpeed loop over the same rows in memory, alternating",
        "blocks on one engine (median ms/step); HF = `transformers.Trainer` with the same DeepSpeed config in its",
        "own process (median ms/step after 5 warm-up steps). ours / HF > 1: ours is faster.",
        "",
        *throughput_lines(results, "cpu"),
        "",
        *precision_lines(precisions, f"the {_parameters(small) / 1e6:.1f}M encoder"),
    ]


def _parameters(encoder: Path) -> float:
    from safetensors import safe_open

    with safe_open(str(encoder / "model.safetensors"), framework="pt") as handle:
        total = 0
        for key in handle.keys():  # noqa: SIM118
            shape = handle.get_slice(key).get_shape()
            total += __import__("math").prod(shape)
    return float(total)


def bench_gpu(output: Path | None, tiny: bool = False) -> list[str]:
    """On the device machine: the ~100M encoder, bf16 + nccl, one GPU, ZeRO-1 and ZeRO-3.
    `tiny`: the same code on CPU ranks with a small encoder, to check the script before a GPU run."""
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="pretrained-gpu-"))
    files = make_data(tmp / "data", 4_000 if tiny else 40_000)
    encoder = make_encoder(tmp / "encoder", files, ENCODER_SMALL if tiny else ENCODER_100M)
    device = "cpu" if tiny else torch.cuda.get_device_name(0)
    results = []
    cases = os.environ.get("TRAINPIPE_BENCH_CASES", "1:64,3:64,1:256")
    for zero, batch in (tuple(case.split(":")) for case in cases.split(",")):
        batch = int(batch)
        try:
            results.append(
                throughput(
                    tmp, files, encoder, zero, 8 if tiny else batch, gpu=not tiny, steps=3 if tiny else 24
                )
            )
        except Exception as exc:
            print(f"ZeRO-{zero} failed: {exc}", file=sys.stderr, flush=True)
    lines = [
        "## GPU: fine-tuning a pretrained ~100M encoder, ours vs the HF Trainer vs bare DeepSpeed, MFU",
        "",
        f"One {device}, one rank (nccl), bf16, the {_parameters(encoder) / 1e6:.1f}M encoder (hidden 768, 14 layers,",
        "FFN 3072) read from a Hugging Face directory (`training.pretrained`), support_tickets subject+body",
        "(at most 96 tokens, dynamic padding). MFU: forward+backward FLOPs counted by FlopCounterMode",
        "on the bare side's batches, against the data sheet's dense bf16 peak.",
        "Command: `python benchmarks/pretrained_bench.py --gpu` on the device machine.",
        "",
        *throughput_lines(results, device),
    ]
    if output is not None:
        output.write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] in ("--memory-worker", "--hf-worker", "--precision-worker"):
        if sys.argv[1] == "--memory-worker":
            _memory_worker(sys.argv[2], int(sys.argv[3]), *(sys.argv[4:5]))
        elif sys.argv[1] == "--precision-worker":
            _precision_worker(sys.argv[2], int(sys.argv[3]))
        else:
            _hf_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        # As the training job does (runtime/train.py): gloo's teardown at exit intermittently
        # aborts a rank ("terminate called without an active exception") after the work is done.
        sys.stdout.flush()
        os._exit(0)
    else:
        parser = argparse.ArgumentParser()
        parser.add_argument("--gpu", action="store_true")
        parser.add_argument(
            "--tiny", action="store_true", help="with --gpu: the GPU part's code on CPU ranks"
        )
        parser.add_argument("--output", type=Path)
        parser.add_argument("--precision", action="store_true", help="only the CPU precision part")
        arguments = parser.parse_args()
        if arguments.precision:
            folder = Path(tempfile.mkdtemp(prefix="pretrained-precision-"))
            rows = make_data(folder / "data", 4_000)
            small = make_encoder(folder / "encoder", rows, ENCODER_SMALL)
            found = precision(folder, rows, small)
            print("\n".join(precision_lines(found, f"the {_parameters(small) / 1e6:.1f}M encoder")))
            sys.exit(0)
        print("\n".join(bench_gpu(arguments.output, arguments.tiny) if arguments.gpu else bench_pretrained()))
