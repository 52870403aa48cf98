# The GPU worker: `autoshard run` as the ranks of `torchrun`, NCCL on CUDA devices.
#
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t autoshard-worker .
# Run one node of 8 GPUs on a plan made for 8 devices (plans in ./plans):
#   docker run --gpus all --ipc=host -v "$PWD/plans:/plans:ro" autoshard-worker \
#       --nproc-per-node 8 -m service.cli run --model llama3-8b --plan /plans/plan.json \
#       --backend nccl --device cuda --steps 10 --check --report /plans/report.json
# Several nodes: --entrypoint torchrun, then --nnodes N --node-rank K --rdzv-endpoint HOST:PORT before -m.
# The same command runs on CPU with gloo in the project's tests (tests/service/test_cli_run.py).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/autoshard PATH=/opt/autoshard/bin:$PATH
# The Python the CUDA base image's Ubuntu ships, whatever its patch release (pinning an apt version breaks the
# build at the distribution's next security update).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"

# torch first and pinned (its Linux wheels on PyPI are the CUDA builds), then the project without dev tools.
RUN pip install "torch==2.13.0"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY autoshard autoshard
COPY solver solver
COPY strategies strategies
COPY runtime runtime
COPY service service
RUN pip install . \
    && useradd --create-home --uid 1000 autoshard
USER 1000

ENTRYPOINT ["torchrun", "--standalone"]
CMD ["--nproc-per-node", "1", "-m", "service.cli", "--help"]
