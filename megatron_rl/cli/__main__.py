"""``python -m megatron_rl.cli``: the ``megatron-rl`` command."""
from megatron_rl.cli import main

raise SystemExit(main())
