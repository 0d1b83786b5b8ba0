"""For mindformers' ``run_mindformer.py``: ``--register_path`` pointing at this directory and, in the
YAML's ``runner_wrapper``, ``auto_register: gradmon_register.GradmonTrainStep``. mindformers then
imports this file, which registers gradmon's wrappers and ``LiveMonitor`` (see docs/mindformers.md).
"""

from gradmon.integrations.mindformers import (  # noqa: F401 - importing registers them
    GradmonTrainStep,
    GradmonTrainStepWithLossScale,
    MindFormersLiveMonitor,
)
