"""``levjepa pretrain --preset NAME [section.key=value ...]`` — the main job.

Examples::

    levjepa pretrain --preset demo-cpu                       # under 10 minutes on 2 idle CPU cores, ends with probes
    levjepa pretrain --preset demo-cpu train.steps=60 data.synthetic.num_train=320 \\
        data.synthetic.num_val=80 data.synthetic.num_test=80  # the same job as a one-minute smoke run (below)
    levjepa pretrain --preset vit-b-paper data.sources=/data/k710_index.txt --run-dir runs/vitb
    torchrun --nproc_per_node=8 -m levjepa pretrain --preset vit-b-paper data.sources=/data/videos
    levjepa pretrain --resume runs/vitb                      # continue exactly where it stopped
    levjepa pretrain --preset demo-cpu --print-config        # the resolved config, then exit
    levjepa pretrain --help-config                           # every config key: default, type, meaning
    levjepa pretrain --config runs/demo/config.json train.steps=2000 --run-dir runs/demo2   # a run's config again
    levjepa pretrain --preset vit-b-paper model.init_from=imported/vitl data.sources=/data/videos  # continued

The smoke run is the main job short: 60 steps instead of 800 and benchmark splits of 320 / 80 / 80 clips
instead of 1600 / 400 / 400 (``--help-config`` lists the keys). It runs in about a minute on 2 idle CPU cores
(longer where other work shares them: the README) and still ends with the table of probes against random
init; its line of demo targets says "missed", as it should after 60 steps: the smoke run checks that everything
runs, the full run what the demo learns.

``model.init_from=PATH`` (a run, an export, ``levjepa import``-ed official weights, a checkpoint file) starts
a fresh run (step 0, fresh optimiser and schedule) from those weights, with their architecture
(``levjepa.train.start``): the line ``init_from: ...`` says what was loaded, ``config.json`` records where it
came from. A ``model.*`` key set on the command line or in ``--config`` that the source's architecture
overrules (``model.dim=64`` on a 32-wide source) is refused, naming the source's value.

Overrides are checked against the config's fields: an unknown key or a bad value fails at once with the
valid choices listed. ``--config FILE`` (JSON, TOML, or YAML with PyYAML) lays a file's keys over the preset
(or over the defaults without ``--preset``); overrides apply on top. A resume may change only the keys of
``levjepa.train.config.RESUMABLE`` (listed by ``--help``); anything else is refused before the run directory
is touched.

The run itself is :func:`levjepa.train.pretrain`; with ``train.eval_at_end`` (the demo; turned off, with a
note, when ``data.sources`` is not the built-in benchmark and the key was not set) this command then
reads the final checkpoint back from the run directory and evaluates it on the built-in benchmark:
frozen probes of the EMA and online weights beside the same architecture at the random initialisation the
run started from (``probe_results.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from levjepa.commands._notes import note
from levjepa.commands._outputs import OutputError, claim_file, claim_folder, folder_kind, is_json_with
from levjepa.config import (
    ConfigError,
    apply_overrides,
    config_reference,
    from_dict,
    merge_config,
    read_config_file,
    to_dict,
)
from levjepa.distributed import launch_rank
from levjepa.eval import EvalConfig, evaluate_benchmark, probe_config
from levjepa.formats.reading.load import load_encoder, load_init_weights, random_encoder
from levjepa.presets import DEMO_MARGIN, DEMO_PROBE, DEMO_TARGETS, PRESETS, demo_misses, needs_sources, preset
from levjepa.threads import choose_threads, torch_threads
from levjepa.train.checkpoint import checkpoint_run
from levjepa.train.config import RESUMABLE, PretrainConfig, check_resume
from levjepa.train.loop import pretrain
from levjepa.train.preemption import stop_now_on_signals
from levjepa.train.report import summary_json
from levjepa.train.run_dir import newer_writer
from levjepa.train.start import with_architecture
from levjepa.version import __version__
from levjepa.weights import CONFIG, PROBE_RESULTS, atomic_write_text, read_json, write_json

__all__ = ["add_arguments", "evaluate_run", "main", "resolve_config"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="named preset (see levjepa.presets)")
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="seed the config from a file (JSON, TOML, YAML), e.g. a config.json"
    )
    parser.add_argument("--run-dir", type=Path, help="run directory (default: runs/<preset>-<time>)")
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR; overrides may change only: " + ", ".join(RESUMABLE),
    )
    parser.add_argument("--overwrite", action="store_true", help="delete an existing --run-dir first")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--help-config", action="store_true", help="list every config key with its type, default and meaning, then exit"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar: one log line per train.log_every steps"
    )
    parser.add_argument("--summary-json", type=Path, help="also write the end-of-run summary here")


def resolve_config(
    preset_name: str | None, overrides: list[str], resume: Path | None, config_file: Path | None = None
) -> PretrainConfig:
    """The run's config: a preset (or the defaults), a config file's keys over it, ``overrides`` on top — or,
    with ``resume``, the run's ``config.json`` with the overrides a resume may make (``check_resume``)."""
    if resume is not None:
        if preset_name or config_file:
            raise ConfigError("--resume continues a run with its own config; drop --preset / --config")
        if not (resume / CONFIG).is_file():
            raise ConfigError(f"{resume}: no config.json here, so there is no run to resume")
        saved = read_json(resume / CONFIG)
        _refuse_export(saved, resume, "--resume")
        with _named_if_newer(resume):
            cfg = apply_overrides(from_dict(PretrainConfig, saved), overrides)
        check_resume(saved, cfg)
        return cfg
    if not preset_name and config_file is None:
        raise ConfigError(f"give --preset NAME ({', '.join(PRESETS)}), --config FILE or --resume RUN_DIR")
    data = read_config_file(config_file) if config_file is not None else {}
    if config_file is not None:
        _refuse_export(data, config_file.parent, "--config")
    base = _base_preset(preset_name, data, config_file)
    cfg = preset(base) if base != "custom" else PretrainConfig()
    if config_file is not None:
        try:
            with _named_if_newer(config_file.parent):
                cfg = merge_config(cfg, data)
        except ConfigError as err:
            raise ConfigError(f"{config_file}: {err}" if str(config_file) not in str(err) else str(err)) from None
    cfg = apply_overrides(cfg, overrides)
    explicit = any(o.split("=")[0].strip() == "train.eval_at_end" for o in overrides) or "eval_at_end" in data.get(
        "train", {}
    )
    if cfg.train.eval_at_end and not explicit and tuple(cfg.data.sources) != ("synthetic",):
        if launch_rank() == 0:  # once per job, not once per process under torchrun / srun
            print(
                f"note: train.eval_at_end off: this run trains on {', '.join(cfg.data.sources)}, and the evaluation "
                "at the end is the built-in benchmark's (train.eval_at_end=true runs it anyway; `levjepa probe RUN "
                "--task index:TRAIN,VAL` evaluates on your own labels)",
                file=sys.stderr,
            )
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_at_end=False))
    if needs_sources(cfg):
        raise ConfigError(
            f"preset {cfg.preset} trains on your videos: add data.sources=PATH "
            "(a folder of videos, a V-JEPA index file `path label`, or several comma-separated)"
        )
    return cfg


@contextlib.contextmanager
def _named_if_newer(run_dir: Path) -> Iterator[None]:
    """A config a newer levjepa wrote may hold keys this one does not know: its error says which wrote it."""
    try:
        yield
    except ConfigError as err:
        newer = newer_writer(run_dir)
        if newer is None:
            raise
        raise ConfigError(
            f"{run_dir} was written by levjepa {newer}, newer than this one ({__version__}): upgrade levjepa to read "
            f"it ({err})"
        ) from None


def _explicit_model_keys(overrides: list[str], config_file: Path | None) -> set[str]:
    """The ``model`` fields set on the command line (``model.dim=64``) or in the ``--config`` file."""
    keys = {o.split("=", 1)[0].strip() for o in overrides if "=" in o}
    names = {k.removeprefix("model.") for k in keys if k.startswith("model.")}
    if config_file is not None:
        section = read_config_file(config_file).get("model")
        names |= set(section) if isinstance(section, dict) else set()
    return names


def _refuse_export(data: dict[str, Any], path: Path, option: str) -> None:
    """A levjepa export (``model_type: levjepa``: an encoder's weights, no run) where a run is expected."""
    if data.get("model_type") == "levjepa" or "exported_at" in data:
        raise ConfigError(
            f"{option} {path}: this is a levjepa export (an encoder's weights, not a run directory): to continue "
            f"pretraining from it start a run with model.init_from={path}; `levjepa probe/extract {path}` read it as is"
        )


def _base_preset(preset_name: str | None, data: dict[str, Any], config_file: Path | None) -> str:
    """The preset a run starts from: ``--preset``, else the config file's ``preset`` key (a finished run's
    ``config.json`` names its own), else the defaults (``custom``). A file naming another preset than
    ``--preset``, or no preset at all, is refused."""
    named = data.get("preset")
    if named is not None and named != "custom" and named not in PRESETS:
        raise ConfigError(
            f"{config_file}: preset = {named!r} is not a preset: choose one of {', '.join(PRESETS)}, or drop the key"
        )
    if preset_name and named not in (None, "custom", preset_name):
        raise ConfigError(f"{config_file} says preset = {named!r} but --preset {preset_name}: keep one of the two")
    return preset_name or (named if named is not None else "custom")


def evaluate_run(cfg: PretrainConfig, run_dir: Path) -> dict[str, Any]:
    """The demo's ending: frozen probes on the built-in benchmark of the run's last checkpoint (EMA weights)
    beside the random initialisation the run started from; writes ``probe_results.json``. (The EMA copy is
    what the paper evaluates; ``levjepa probe RUN --weights online`` adds the online weights, at the cost of
    one more encoder to probe.)"""
    print(
        f"train.eval_at_end: frozen probes of {run_dir} on the built-in benchmark (image source "
        f"{cfg.data.synthetic.image_source}; train.eval_at_end=false skips this)",
        file=sys.stderr,
        flush=True,
    )
    encoders = {
        "pretrained (EMA)": load_encoder(run_dir, weights="ema").encoder,
        "random init": random_encoder(cfg.model, seed=cfg.train.seed).encoder,
    }
    demo = cfg.preset in ("demo-cpu", "demo-cpu-long")  # the benchmark, probe and targets these presets were tuned for
    probe = probe_config(cfg.train.eval_budget, **DEMO_PROBE) if demo else None
    evaluation = EvalConfig(budget=cfg.train.eval_budget, probe=probe, seed=cfg.train.seed, progress=True)
    with torch_threads(cfg.train.threads):  # the run's count holds for its ending too: 2 runs of 1 thread share 2 cores
        result = evaluate_benchmark(encoders, cfg.data.synthetic, evaluation)
    data = result.to_json()
    write_json(run_dir / PROBE_RESULTS, data)
    print(result.table(), file=sys.stderr)
    if demo:
        print(demo_verdict(data["accuracy"]["pretrained (EMA)"], data["accuracy"]["random init"]), file=sys.stderr)
    return data


def demo_verdict(pretrained: dict[str, dict[str, float]], random_init: dict[str, dict[str, float]]) -> str:
    """The line under the demo's table: its promise (``levjepa.presets.DEMO_TARGETS``), and what was missed."""
    promise = ", ".join(f"{t} >= {v:.0f}" for t, v in DEMO_TARGETS.items())
    misses = demo_misses(pretrained, random_init)
    head = f"demo targets (best probe per task: {promise} %, each >= {DEMO_MARGIN:.0f} points over random init): "
    return head + ("all met" if not misses else "missed " + "; ".join(misses))


def config_help() -> str:
    """``--help-config``: every key of :class:`PretrainConfig`, generated from the dataclasses and their comments."""
    head = (
        "Every config key: section.key = default  [type]  meaning. Set one with section.key=value on the command\n"
        "line (a tuple as a,b; null as none) or in a --config file; presets change some defaults (--preset NAME\n"
        f"--print-config shows them). A --resume may change only: {', '.join(RESUMABLE)}.\n"
    )
    return head + "\n" + config_reference(PretrainConfig)


def _evaluation_stopped(run: Path, checkpoint: Path | None, signal_name: str) -> str:
    return (
        f"{signal_name} received during the evaluation at the end of the run: the run itself is complete "
        f"(checkpoint {checkpoint}); evaluate it with `levjepa probe {run}`"
    )


def check_options(args: argparse.Namespace) -> None:
    """Options that cannot both hold refused in one line, and every output claimed (``commands._outputs``)
    before the config is resolved: ``--run-dir`` with ``--resume`` (the run resumed is the one ``--resume``
    names), ``--overwrite`` with ``--resume`` or without ``--run-dir`` (the default one is always new), and
    ``--overwrite`` of a folder that is no pretraining run."""
    if args.help_config:
        given = [o for o, v in (("--preset", args.preset), ("--config", args.config), ("--resume", args.resume)) if v]
        given += [o for o, v in (("--run-dir", args.run_dir), ("--print-config", args.print_config)) if v]
        if given or args.overrides:
            what = ", ".join(given + (["overrides"] if args.overrides else []))
            raise ConfigError(f"--help-config lists every key and exits, so {what} would do nothing: drop them")
        return
    if args.resume is not None and args.overwrite:
        raise ConfigError("--resume continues a run and --overwrite deletes one: choose one of the two")
    if args.resume is not None and args.run_dir is not None:
        run = checkpoint_run(args.resume)[0]
        if Path(args.run_dir).resolve() != Path(run).resolve():
            raise ConfigError(
                f"--run-dir {args.run_dir} and --resume {args.resume}: a resume continues the run it names, in its "
                f"own directory; drop --run-dir (or start a new run in {args.run_dir} without --resume)"
            )
    if args.overwrite and args.run_dir is None:
        raise ConfigError(
            "--overwrite deletes an existing --run-dir, and without --run-dir the run goes to a new "
            "runs/<preset>-<time>: give --run-dir DIR or drop --overwrite"
        )
    if args.print_config:
        return
    if args.run_dir is not None and args.resume is None:
        found = folder_kind(args.run_dir)
        if args.overwrite and found is None and Path(args.run_dir).is_dir() and any(Path(args.run_dir).iterdir()):
            raise OutputError(
                f"--run-dir {args.run_dir}: holds files but is no pretraining run, and --overwrite deletes only a "
                "run; choose another --run-dir"
            )
        claim_folder(args.run_dir, "--run-dir", "run", resumes=True)  # a run of its own: prepare_run_dir decides
    if args.summary_json is not None:
        own = is_json_with("run_dir", "steps", "wall_s")
        again = args.resume is not None or args.overwrite
        claim_file(
            args.summary_json, "--summary-json", "a run summary", is_own=own, overwrite=again, overwrite_flag="--resume"
        )


def main(args: argparse.Namespace) -> int:
    """Errors (a bad key, a refused resume, unreadable data) reach the dispatcher, which prints them in one line."""
    check_options(args)
    if args.help_config:
        print(config_help())
        return 0
    run = checkpoint_run(args.resume)[0] if args.resume is not None else None  # RUN, or RUN/checkpoints/step_N
    cfg = resolve_config(args.preset, args.overrides, run, args.config)
    start = None
    if cfg.model.init_from and args.resume is None:  # continued pretraining: the source's weights and architecture
        start = load_init_weights(cfg.model.init_from)
        explicit = _explicit_model_keys(args.overrides, args.config)
        cfg = dataclasses.replace(cfg, model=with_architecture(cfg.model, start, explicit))
    if args.print_config:
        print(json.dumps(to_dict(cfg), indent=2))
        return 0
    threads = choose_threads(cfg.train.threads, setting="train.threads=N")  # None: the CPUs free now (threads.py)
    if launch_rank() == 0:
        note(threads.line)
    with torch_threads(threads.threads):  # the run and its ending: train.threads=None keeps this count
        summary = pretrain(
            cfg,
            args.resume if args.resume is not None else args.run_dir,
            resume=args.resume is not None,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            start_weights=start,
        )
        if cfg.train.eval_at_end and summary.rank == 0:
            stopped = functools.partial(_evaluation_stopped, summary.run_dir, summary.checkpoint)
            with stop_now_on_signals(stopped):  # the run is complete: a signal here loses no training
                summary.probe_results = evaluate_run(cfg, summary.run_dir)
    if args.summary_json:
        atomic_write_text(args.summary_json, json.dumps(summary_json(summary), indent=2))
    return 0
