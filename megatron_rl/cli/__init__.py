"""The ``megatron-rl`` console script: ``train | demo | eval | convert | data | plan``.

Each subcommand dispatches to the ``main`` of the module that owns it; this file only parses,
dispatches and turns user errors into one clear line (``--debug`` shows the traceback)::

    megatron-rl train --config examples/configs/tiny_cpu_grpo.yaml [a.b=c ...] [--resume auto|PATH]
    megatron-rl train --config C --dry-run [a.b=c ...]   -> every rank role simulated on this CPU (trainer/dryrun/)
    megatron-rl train --print-config [--algo KIND]    -> every key, default, description (config_doc.py)
    megatron-rl train --print-config --config X [a.b=c ...]  -> X's value of every key, with its description
    megatron-rl demo [--algo bicc_rcc] ...            -> megatron_rl.cli.demo.main(argv)
    megatron-rl eval ...                              -> megatron_rl.eval main(argv)
    megatron-rl convert hf-to-mcore|mcore-to-hf ...   -> megatron_rl.convert.cli.main(argv)
    megatron-rl data prepare SOURCE --in X --out D    -> megatron_rl.data.cli.main(argv)
    megatron-rl data generate kk --out data/kk ...    -> megatron_rl.data.cli.main(argv)
    megatron-rl plan --model qwen3-8b --tp 2 --pp 1 --dp 4 --micro-batch 1 --seq-len 8192

``demo``, ``eval``, ``convert`` and ``data`` pass every argument after the subcommand unchanged to the
owner's parser, so ``megatron-rl convert --help`` prints the converter's own help.
Under ``torchrun`` every rank runs the same command line.
"""
from __future__ import annotations

import argparse
import os
import contextlib
import importlib
import re
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import yaml

from megatron_rl import __version__
from megatron_rl.cli import plan
from megatron_rl.cli.config_doc import print_config
from megatron_rl.config import load_config
from megatron_rl.runtime.console import fresh_line, resume_command
from megatron_rl.runtime.diskspace import DiskSpaceError, NotWritableError
from megatron_rl.runtime.usage import OneLineParser, error_status, reset_phase
from megatron_rl.trainer.loop.preflight import load_checked, preflight
from megatron_rl.trainer.loop.stop import end_children, exit_code

#: pass-through subcommands -> candidate ``module:function`` owners of ``main(argv)``, in order.
PASSTHROUGH: dict[str, tuple[str, ...]] = {
    "demo": ("megatron_rl.cli.demo:main",),
    "eval": ("megatron_rl.eval.cli:main", "megatron_rl.eval:main"),
    "convert": ("megatron_rl.convert.cli:main",),
    "data": ("megatron_rl.data.cli:main",),
}
HELP = {
    "train": "run RL training from a YAML config (+ dotted overrides); resumable",
    "demo": "tiny CPU end-to-end run: warm start, RL, held-out accuracy before/after",
    "eval": "evaluate a checkpoint on a held-out prompt set or the papers' named benchmarks",
    "convert": "checkpoint conversion: hf-to-mcore | mcore-to-hf",
    "data": "make the papers' data sets: prepare a downloaded dataset (the paper's prompt and reward), generate kk",
    "plan": "estimate per-GPU memory for a model x TP x PP x DP x micro-batch x seq-len",
}
COMMANDS = tuple(HELP)
#: pass-through commands whose owners send the libraries' INFO to a log file unless ``--verbose``
VERBOSE_OWNERS = ("eval", "convert")
#: exception types reported as one ``error:`` line instead of a traceback.
USER_ERRORS = (ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError, ImportError,
               DiskSpaceError,   # a full disk (megatron_rl/runtime/diskspace.py): a runtime error, one line
               NotWritableError)  # a read-only or foreign place of a write (diskspace.check_writable)
#: ``section.key=value``; a mapping entry's key may be a data source's name (``reward.by_source.openai/gsm8k=math``)
OVERRIDE_RE = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)?(\.\w[\w/+-]*)*=.*$", re.DOTALL)


class CliError(Exception):
    """A user-facing error: printed as ``megatron-rl <cmd>: error: <message>``."""


class ParsedCommand(NamedTuple):
    """Result of :func:`parse_command`: the command, its argparse namespace, pass-through argv."""

    command: str | None
    args: argparse.Namespace
    rest: list[str]


def override(text: str) -> str:
    """argparse type for ``a.b=c``: a dotted key, ``=``, any value (parsed as YAML by the config)."""
    if not OVERRIDE_RE.match(text):
        raise argparse.ArgumentTypeError(f"override {text!r} is not of the form section.key=value (e.g. algo.kind=grpo; "
                                         "a whole mapping in YAML flow form: 'reward.by_source={openai/gsm8k: math}')")
    return text


def resume_value(text: str) -> str | None:
    """``--resume``: ``auto`` (newest complete checkpoint), ``none`` (fresh run) or a checkpoint path."""
    return None if text.lower() == "none" else text


def build_parser() -> argparse.ArgumentParser:
    """The full ``megatron-rl`` parser (pass-through subcommands take no options here)."""
    p = OneLineParser(prog="megatron-rl", description="RL post-training on Megatron-core with vLLM rollouts.",
                      epilog="Run 'megatron-rl <command> --help' for the options of a command.")
    p.add_argument("--version", action="version", version=f"megatron-rl {__version__}")
    p.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")

    t = sub.add_parser("train", help=HELP["train"], description=HELP["train"])
    t.add_argument("--config", help="YAML config (see examples/configs/); required unless --print-config")
    t.add_argument("overrides", nargs="*", type=override, metavar="a.b=c",
                   help="dotted overrides applied on top of the YAML, e.g. algo.kind=dapo trainer.steps=10")
    t.add_argument("--resume", type=resume_value, default=None, metavar="auto|PATH",
                   help="'auto': newest complete checkpoint in the run directory; PATH: that checkpoint; "
                        "default: fresh run")
    t.add_argument("--check", action="store_true",
                   help="load and validate the config, run every start-up check (files, run dir, backend, grader), "
                        "print it, and exit")
    t.add_argument("--overwrite", action="store_true",
                   help="fresh run in a used trainer.run_dir: move the earlier run to run_dir/archive/<time>/ first")
    t.add_argument("--allow-config-change", action="store_true",
                   help="--resume even though algo.kind, rollout.n or the model differ from the run's config.yaml")
    t.add_argument("--simulate-gpu", action="store_true",
                   help="run the trainer's GPU code path on this CPU: tensors carry the device a GPU would give them, "
                        "mixed devices and host tensors to NCCL groups fail, host syncs are counted per step "
                        "(sim/* metrics; docs/simulated-gpu.md)")
    t.add_argument("--dry-run", action="store_true",
                   help="simulate every rank role of the config's layout on this CPU (fake process group, meta device "
                        "memory): build every model, run one RL step, print the memory measured beside megatron-rl plan's "
                        "(model.hf_path needs only config.json; trainer/dryrun/)")
    t.add_argument("--print-config", action="store_true",
                   help="print every config key with its default and description (a loadable YAML) and exit; "
                        "with --config X [a.b=c ...]: X's values")
    t.add_argument("--algo", metavar="KIND", default=None,
                   help="with --print-config: show the algo.<KIND> section of that method (default: grpo)")

    for name in PASSTHROUGH:
        sub.add_parser(name, help=HELP[name], add_help=False,
                       description=f"{HELP[name]} (options: megatron-rl {name} --help)")

    pl = sub.add_parser("plan", help=HELP["plan"], description=plan.__doc__.split("\n\n")[0])
    plan.add_arguments(pl)
    return p


def parse_command(argv: Sequence[str]) -> ParsedCommand:
    """Parse ``argv``; for pass-through commands everything after the command name is ``rest``."""
    argv = list(argv)
    parser = build_parser()
    idx = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if idx is not None and argv[idx] in PASSTHROUGH:
        return ParsedCommand(argv[idx], parser.parse_args(argv[: idx + 1]), argv[idx + 1:])
    if idx is not None and argv[idx] == "train":
        _once(argv[idx + 1:], ("--config", "--resume", "--algo"))
    args, extra = parser.parse_known_args(argv)
    if args.command == "train" and not args.config and not args.print_config:
        _train_usage_error("the following arguments are required: --config (or --print-config)")
    if args.command == "train" and args.print_config and (args.check or args.resume or args.overwrite):
        _train_usage_error("--print-config prints a config and exits; it does not go with --check, --resume or --overwrite")
    if args.command == "train" and args.dry_run and (args.check or args.resume or args.overwrite or args.simulate_gpu
                                                     or args.print_config):
        _train_usage_error("--dry-run simulates the config's rank roles and exits; it does not go with --check, --resume, "
                           "--overwrite, --simulate-gpu or --print-config")
    if args.command == "train" and args.algo and not args.print_config:
        _train_usage_error("--algo KIND goes with --print-config (a run's method is the override algo.kind=KIND)")
    if extra and args.command == "train" and all(OVERRIDE_RE.match(x) and not x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]     # overrides after an option: train --check a.b=c
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return ParsedCommand(args.command, args, [])


def _once(argv: Sequence[str], options: tuple[str, ...]) -> None:
    """An option that takes a value given twice is a usage error (argparse keeps the last silently)."""
    for opt in options:
        given = [a for a in argv if a == opt or a.startswith(opt + "=")]
        if len(given) > 1:
            _train_usage_error(f"{opt} given {len(given)} times; give it once")


def _train_usage_error(message: str):
    """A ``train`` usage error: one line, exit status 2 (``usage.OneLineParser``)."""
    OneLineParser(prog="megatron-rl train").error(message)


def check_overrides(overrides: Sequence[str]) -> None:
    """The same key overridden twice with two values on one command line is refused: the last one won
    silently, so a value typed early in a long command line did nothing (the same value twice, as a
    wrapper script and its user may both pass it, is harmless)."""
    seen: dict[str, str] = {}
    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if key in seen and seen[key].split("=", 1)[1] != o.split("=", 1)[1]:
            raise CliError(f"override {key} given twice with different values ({seen[key]} and {o}): keep one")
        seen[key] = o


def resolve_main(command: str) -> Callable[[list[str]], int | None]:
    """Import the owner's ``main(argv)`` for a pass-through command (first candidate that exists)."""
    tried = []
    for spec in PASSTHROUGH[command]:
        mod_name, fn = spec.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and mod_name.startswith(e.name):  # the module itself is missing: try the next one
                tried.append(spec)
                continue
            raise
        if callable(getattr(mod, fn, None)):
            return getattr(mod, fn)
        tried.append(spec)
    raise CliError(f"this installation has no implementation of '{command}' (looked for {', '.join(tried)})")


def run_train(args: argparse.Namespace) -> int:
    """``train``: ``preflight.load_checked(yaml, overrides)`` then ``trainer.loop.main(cfg, resume=...)``."""
    if args.print_config and not args.config:
        if args.overrides:
            raise CliError("--print-config prints the defaults; overrides go with --config X (--print-config --config X a.b=c "
                           "prints that config's values)")

        print_config(args.algo)
        return 0
    if Path(args.config).is_dir():
        raise CliError(f"--config {args.config} is a directory; pass a YAML file (e.g. examples/configs/tiny_cpu_grpo.yaml)")
    if not Path(args.config).is_file():
        raise CliError(f"config file not found: {args.config}")
    check_overrides(args.overrides)
    if args.print_config:   # --config X: X's values (and the overrides'), each with its description
        print_config(args.algo, load_config(args.config, list(args.overrides)))
        return 0

    if args.dry_run:   # the config checked as train checks it, the model's config.json only (trainer/dryrun/run.py)
        from megatron_rl.trainer.dryrun.run import main as dry_run  # lazy: defers torch to the call

        return dry_run(args.config, list(args.overrides))
    cfg = load_checked(args.config, list(args.overrides))   # fields, then the cross-component rules
    if args.check:
        preflight(cfg, args.resume, args.overwrite, args.allow_config_change)   # train's start-up checks, nothing started
        print(f"config OK: {args.config}" + (f" with {len(args.overrides)} override(s)" if args.overrides else ""))

        tree = cfg.to_dict() if callable(getattr(cfg, "to_dict", None)) else cfg
        print(yaml.safe_dump(tree, sort_keys=False, default_flow_style=False) if isinstance(tree, dict) else tree)
        return 0
    if args.simulate_gpu:
        _simulate_gpu()
    from megatron_rl.trainer.loop import rl_loop as loop  # lazy: defers torch to the call

    return _exit_code(loop.main(cfg, resume=args.resume, overwrite=args.overwrite,
                                resume_cmd=resume_command(args.config, args.overrides),
                                allow_config_change=args.allow_config_change))


def _simulate_gpu() -> None:
    """``--simulate-gpu``: the variable every rank of this launch reads (``runtime/simulated_gpu.requested``);
    refused where a real GPU is present (run the real thing there)."""
    from megatron_rl.runtime.device import has_cuda  # lazy: torch only when training
    from megatron_rl.runtime.simulated_gpu import ENV  # lazy: as above

    if has_cuda():
        raise CliError("--simulate-gpu: this machine has a GPU; run without --simulate-gpu to use it")
    os.environ[ENV] = "1"


def _exit_code(result) -> int:
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def dispatch(cmd: ParsedCommand) -> int:
    """Run a parsed command and return its exit status."""
    if cmd.command == "train":
        return run_train(cmd.args)
    if cmd.command == "plan":
        return plan.exit_status(plan.run(cmd.args))
    rest = list(cmd.rest)
    if cmd.args.debug and cmd.command in VERBOSE_OWNERS and "--verbose" not in rest:
        rest.append("--verbose")   # --debug shows everything: the libraries' INFO on the console, not OUT's log
    return _exit_code(resolve_main(cmd.command)(rest))


class Signalled(BaseException):
    """SIGINT / SIGTERM received by a command outside a training run's own handling (``trainer/loop/stop.py``):
    raised where the main thread is, so ``finally`` blocks and the writers' temp-dir cleanup run
    (``convert/atomic.py``), then :func:`main` prints one line and exits 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_end_in_one_line():
    """While a command runs: SIGINT and SIGTERM raise :class:`Signalled` (Ctrl-C was a
    ``KeyboardInterrupt`` traceback, SIGTERM a silent death); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise Signalled(signum)

    previous = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(s) is not signal.SIG_IGN}   # an ignored signal (a background job's SIGINT) stays so
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point. Exit status (docs/troubleshooting.md, "Exit codes"): 0 ok; 2 usage or configuration
    error, refused before the run starts; 1 runtime error after start-up (``usage.begin_run`` marks it)."""
    reset_phase()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" not in argv:   # megatron-core's "TE/Apex not installed, falling back" on every CPU import
        warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex).* not installed.*", category=UserWarning)
    cmd = parse_command(argv)
    if cmd.command is None:
        build_parser().print_help()
        return 2
    try:
        with _signals_end_in_one_line():
            return dispatch(cmd)
    except Signalled as e:   # a signal outside a training run: one line, 128 + signum, our children ended
        end_children()
        print(f"{fresh_line()}megatron-rl {cmd.command}: stopped by {signal.Signals(e.signum).name}; nothing "
              "half-written is left in place", file=sys.stderr)
        return exit_code(e.signum)
    except (CliError, *USER_ERRORS) as e:
        if cmd.args.debug:
            traceback.print_exc()
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        hint = "" if cmd.args.debug else " (run 'megatron-rl --debug ...' for the traceback)"
        kind = "" if isinstance(e, CliError) else f"{type(e).__name__}: "

        print(f"{fresh_line()}megatron-rl {cmd.command}: error: {kind}{msg}{hint}", file=sys.stderr)
        return error_status()


if __name__ == "__main__":
    raise SystemExit(main())
