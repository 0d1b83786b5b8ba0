"""The tiny Llama of the mindformers example, tests and benchmark, and its token data (no download).

The model is mindformers' ``LlamaForCausalLM`` with the ``model_config`` of ``tiny_llama.yaml``
(2 layers, hidden 64, 4 heads, vocab 256, seq 32; float32 and the CPU settings), so the YAML is the
one description of it. A sample is ``seq_length + 1`` token ids: the model shifts them into inputs
and labels. The tokens are counting runs ``a, a+k, a+2k, ...`` modulo the vocabulary, which the
model can learn. Writing the example's MindRecord:

    python examples/mindformers/tiny_llama.py data/tiny_llama [--samples 256]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "tiny_llama.yaml")


def model_config(config_path: str = CONFIG, **overrides: Any) -> dict[str, Any]:
    """The YAML's ``model.model_config`` as keyword arguments of ``LlamaConfig`` (``type`` dropped)."""
    import yaml

    with open(config_path, encoding="utf-8") as f:
        section = dict(yaml.safe_load(f)["model"]["model_config"])
    section.pop("type", None)
    section.update(overrides)
    return section


def tiny_llama(seed: int = 0, **overrides: Any) -> Any:
    """A fresh ``LlamaForCausalLM`` (the network computes its own loss from ``input_ids``)."""
    import mindspore as ms
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM

    ms.set_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**model_config(**overrides)))


def counting_tokens(samples: int, seq_length: int = 32, vocab: int = 256, seed: int = 0) -> np.ndarray:
    """``(samples, seq_length + 1)`` int32 token ids: counting runs with random starts and strides."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, vocab, (samples, 1))
    strides = rng.integers(1, 4, (samples, 1))
    return ((starts + strides * np.arange(seq_length + 1)) % vocab).astype(np.int32)


def write_dataset(out_dir: str, samples: int = 256, seq_length: int = 32, vocab: int = 256) -> str:
    """Write ``out_dir/tiny_llama.mindrecord`` (column ``input_ids``) for the YAML's MindDataset."""
    from mindspore.mindrecord import FileWriter

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tiny_llama.mindrecord")
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tiny llama tokens")
    writer.write_raw_data([{"input_ids": row} for row in counting_tokens(samples, seq_length, vocab)])
    writer.commit()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="write the tiny Llama example's MindRecord")
    parser.add_argument("out_dir")
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    print(write_dataset(args.out_dir, args.samples))


if __name__ == "__main__":
    main()
