"""``megatron-rl data prepare``: the seeds' downloaded datasets -> verl parquet rows (the paper's prompt,
the ``data_source`` that selects the reference's reward, the ground truth, the privileged reference
solution) with a manifest. One module per source family (``math_sources``, ``qa_sources``,
``verl_sources``), the registry (``registry``), the run (``pipeline``), files (``io``), the CLI (``cli``)."""
from megatron_rl.data.prepare import math_sources, qa_sources, verl_sources  # noqa: F401  (each registers its sources)
