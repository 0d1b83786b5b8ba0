"""Train from a mindformers YAML config with gradmon's wrapper and callback registered.

    python examples/mindformers/train.py examples/mindformers/tiny_llama.yaml [--mode 0|1] [--output-dir DIR]

What mindformers' ``run_mindformer.py --config ...`` does for ``run_mode: train``, plus the one line
that registers gradmon in mindformers' registry (``import gradmon.integrations.mindformers``).
"""

from __future__ import annotations

import argparse

from mindformers import MindFormerConfig, Trainer, build_context
from mindformers.utils.file_utils import set_output_path

import gradmon.integrations.mindformers  # noqa: F401 - registers GradmonTrainStep and LiveMonitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="YAML config (e.g. examples/mindformers/tiny_llama.yaml)")
    parser.add_argument("--mode", type=int, choices=(0, 1), help="0 GRAPH, 1 PYNATIVE (default: the config)")
    parser.add_argument("--output-dir", help="mindformers' output_dir (default: the config's)")
    parser.add_argument("--dataset-dir", help="train_dataset.data_loader.dataset_dir (default: the config's)")
    args = parser.parse_args()

    config = MindFormerConfig(args.config)
    if args.mode is not None:
        config.context.mode = args.mode
    if args.output_dir:
        config.output_dir = args.output_dir
    if args.dataset_dir:
        config.train_dataset.data_loader.dataset_dir = args.dataset_dir
    set_output_path(config.output_dir)
    build_context(config)
    Trainer(config).train()


if __name__ == "__main__":
    main()
