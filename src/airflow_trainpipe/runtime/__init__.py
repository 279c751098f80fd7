"""The training job: runs under torchrun, in a local child process or a Kubernetes pod.

train (the entrypoint: wires the components), engine (DeepSpeed), steps (one optimizer step and
the periodic collective), epochs (EpochEnd), finish (RunEnd: the end-of-run phase), tracking
(MLflow, rank 0), serving (the logged model on raw rows), accounting, startup (where the time
before the first step goes), rungs (a tuning trial's rungs, asked of its study), extensions;
data/, models/, evaluation/, resume/ hold the rest. Submodules import torch, deepspeed and mlflow at
module top; nothing outside this package (and data.validation) may import them at module top.
"""
