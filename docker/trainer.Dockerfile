# Trainer image: the training entrypoint under torchrun, for launcher: kubernetes.
#   docker build -f docker/trainer.Dockerfile -t trainpipe-trainer:0.1.0 .
# CUDA runtime matching the torch wheels' CUDA (the training loop uses torch's AdamW, so no
# DeepSpeed op needs compiling at run time).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/trainpipe \
    PATH=/opt/trainpipe/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/trainpipe

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
# constraints.txt pins the CPU wheel's version; the CUDA wheel of the same version comes from
# the PyTorch index.
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" --constraint constraints.txt .

# Non-root, matching training.kubernetes.run_as_user; the pods mount a writable emptyDir at
# /var/tmp/trainpipe and keep the root filesystem read-only.
RUN groupadd --gid 1000 trainer && useradd --uid 1000 --gid 1000 --no-create-home --shell /usr/sbin/nologin trainer
USER 1000:1000
WORKDIR /var/tmp/trainpipe
ENV HOME=/var/tmp/trainpipe TRAINPIPE_HOME=/var/tmp/trainpipe

# The manifest sets the command: python -m torch.distributed.run ... -m airflow_trainpipe.runtime.train
CMD ["python", "-m", "airflow_trainpipe.runtime.train", "--help"]
