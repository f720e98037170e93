#!/usr/bin/env python
"""Megatron -> HF checkpoint. Thin wrapper: ``megatron-rl convert mcore-to-hf --help``."""
import sys

from megatron_rl.convert.cli import main

if __name__ == "__main__":
    sys.exit(main(["mcore-to-hf", *sys.argv[1:]]))
