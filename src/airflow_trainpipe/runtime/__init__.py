"""The training job: runs under torchrun, in a local child process or a Kubernetes pod.

Submodules import torch, deepspeed and mlflow at module top; nothing outside this package
(and the validation package) may import them at module top.
"""
