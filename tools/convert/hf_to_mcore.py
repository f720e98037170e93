#!/usr/bin/env python
"""HF -> Megatron checkpoint. Thin wrapper: ``megatron-rl convert hf-to-mcore --help``."""
import sys

from megatron_rl.convert.cli import main

if __name__ == "__main__":
    sys.exit(main(["hf-to-mcore", *sys.argv[1:]]))
