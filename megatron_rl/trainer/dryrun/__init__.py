"""The dry run (``megatron-rl train --config C --dry-run``, issue 52): a config's full-size layout simulated rank
role by rank role on a CPU, its memory measured against ``megatron-rl plan``.

Each role (a pipeline stage; TP / CP / DP ranks alike) runs in a process of its own (``worker.py``) on torch's
fake process group at the layout's world size, with the device memory as meta tensors the code sees as CUDA
(``runtime/fake_device.py``): the trainer's own classes build every model the method holds (``build.py``) and
run one RL step (``step.py``); what they allocate is measured (``measure.py``) and printed beside the plan
(``report.py``), with oracles (``oracles.py``), by ``run.py``.

Modules: ``roles`` (layout, world, roles) · ``te_standin`` (TE's attention and norms in megatron's local spec) ·
``build`` · ``measure`` · ``step`` · ``oracles`` · ``report`` · ``worker`` · ``run``.
"""
