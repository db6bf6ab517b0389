"""Every config key a user can set refuses an out-of-range value in one line that names the key and what is valid.

The tables below hold, for every key of the configs a command line sets — ``levjepa pretrain``'s ``section.key=value``
(``PretrainConfig``: model, data, data.synthetic, objective, optim, train), ``levjepa finetune``'s ``key=value``
(``FinetuneConfig``) and ``levjepa probe --set key=value`` (``ProbeConfig``) — one value outside the key's range,
or, for the keys no range bounds (paths, names), where they are checked instead. A key added without an entry
fails the coverage test, so the walk cannot fall behind the configs.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from levjepa.commands import main as cli_main
from levjepa.config import ConfigError, _is_optional, apply_overrides
from levjepa.eval.probes import ProbeConfig
from levjepa.finetune.config import FinetuneConfig
from levjepa.presets import preset

# key -> a value outside its range (numbers; Literal and bool keys get a word that is no choice, below)
PRETRAIN_BAD = {
    "model.dim": "0",
    "model.depth": "100000",
    "model.heads": "-1",
    "model.mlp_ratio": "0",
    "model.patch_size": "0",
    "model.tubelet": "1000",
    "model.in_chans": "0",
    "model.drop_ratio": "1",
    "model.proj_hidden": "0",
    "model.proj_dim": "10000000",
    "model.rope_base": "1",
    "model.init_std": "0",
    "model.norm_eps": "-1e-6",
    "model.readout_layers": "99",
    "data.sources": "",
    "data.weights": "1,-1",
    "data.samples_per_epoch": "0",
    "data.num_frames": "0",
    "data.frame_stride": "0",
    "data.target_fps": "0",
    "data.short_side": "-1",
    "data.min_side": "0",
    "data.max_side": "8",
    "data.num_global": "0",
    "data.num_local": "-1",
    "data.global_size": "4",
    "data.local_size": "100000",
    "data.global_scale": "0.5,1.5",
    "data.local_scale": "0,0.4",
    "data.crop_ratio": "2,1",
    "data.flip_p": "1.5",
    "data.reverse_p": "-0.1",
    "data.jitter_p": "2",
    "data.brightness": "1",
    "data.contrast": "-1",
    "data.saturation": "1.5",
    "data.hue": "0.6",
    "data.grayscale_p": "-1",
    "data.batch_size": "0",
    "data.num_workers": "-1",
    "data.prefetch_factor": "0",
    "data.decode_threads": "-1",
    "data.repeats": "0",
    "data.repeat_shift": "-1",
    "data.synthetic.size": "8",
    "data.synthetic.num_frames": "1",
    "data.synthetic.num_train": "0",
    "data.synthetic.num_val": "-5",
    "data.synthetic.num_test": "100000000",
    "data.synthetic.seed": "-1",
    "data.synthetic.object_scale": "0.9",
    "data.synthetic.speed": "0",
    "data.synthetic.speed_jitter": "1",
    "data.synthetic.friction": "0",
    "data.synthetic.background_motion_p": "2",
    "data.synthetic.background_speed": "-1",
    "data.synthetic.texture_cutoff": "0",
    "data.synthetic.texture_contrast": "3",
    "data.synthetic.background_value": "0,0.5",
    "data.synthetic.background_saturation": "0.5,0.2",
    "data.synthetic.object_saturation": "-1,1",
    "data.synthetic.object_value": "0.5,2",
    "objective.lam": "-0.1",
    "objective.num_directions": "0",
    "objective.num_nodes": "1",
    "objective.t_max": "0",
    "objective.num_global_views": "2",
    "objective.num_clusters": "0",
    "objective.min_cluster_size": "1",
    "objective.local_directions": "0",
    "objective.kmeans_iters": "0",
    "objective.seed": "-1",
    "optim.lr": "0",
    "optim.start_lr": "-1",
    "optim.final_lr": "-1",
    "optim.warmup_steps": "-1",
    "optim.betas": "0.9,1",
    "optim.eps": "0",
    "optim.weight_decay": "-0.1",
    "optim.grad_clip": "0",
    "train.steps": "0",
    "train.batch_size": "-1",
    "train.ema_decay": "1",
    "train.ema_every": "0",
    "train.ema_warmup": "-1",
    "train.checkpoint_every": "0",
    "train.keep_last": "0",
    "train.keep_every": "0",
    "train.log_every": "0",
    "train.max_consecutive_skips": "0",
    "train.seed": "-1",
    "train.threads": "-1",
    "train.loggers": "tensorbord",
}
FINETUNE_BAD = {
    "task": "only-one.txt",
    "frames": "0",
    "frame_stride": "-1",
    "fps": "0",
    "size": "0",
    "slots": "0",
    "head": "mlp",
    "head_depth": "0",
    "steps": "0",
    "batch_size": "0",
    "micro_batch": "-1",
    "lr": "-1e-3",
    "min_lr": "1",
    "warmup_steps": "-1",
    "weight_decay": "-0.05",
    "layer_decay": "0",
    "beta1": "1",
    "beta2": "-0.1",
    "drop_path": "1",
    "label_smoothing": "1",
    "mixup": "-1",
    "keep_ratio": "0",
    "crop_scale": "0.5,0.4",
    "flip_p": "2",
    "seed": "-1",
    "eval_every": "0",
    "checkpoint_every": "0",
    "keep_last": "0",
    "log_every": "0",
    "max_consecutive_skips": "0",
    "workers": "-1",
    "loggers": "tensorbord",
    "device": "gpu",
}
PROBE_BAD = {
    "depth": "0",
    "num_heads": "-1",
    "mlp_ratio": "0",
    "lrs": "1e-3,-1",
    "weight_decays": "-1",
    "linear_lrs": "0",
    "linear_weight_decays": "-0.1",
    "epochs": "0",
    "linear_epochs": "-1",
    "batch_size": "0",
    "warmup_epochs": "-1",
    "beta1": "1",
    "beta2": "1.5",
    "init_std": "0",
    "average_last": "2",
    "select": "accuracy",
    "schedule": "cosine",
    "final_wd_ratio": "-0.5",
}
# keys no range bounds, and where a wrong value is refused in one line instead
FREE = {
    "preset": "a name the preset table checks (--preset)",
    "model.init_from": "a path read at the run's start by levjepa.formats.reading.load (its error names it)",
    "source": "a path levjepa.formats.reading.load reads (DataError / WeightsError naming it)",
    "data.synthetic.fashion_mnist_dir": "a folder; missing files fall back to the bundled digits with a note",
    "protocol": "FinetuneConfig.views: ConfigError listing the protocols",
    "head_from": "a kept probe's folder, read by levjepa.formats.reading.classifier",
}
CONFIGS = {
    "pretrain": (lambda: preset("demo-cpu"), PRETRAIN_BAD),
    "finetune": (lambda: FinetuneConfig(source="run", task=("train.txt", "val.txt")), FINETUNE_BAD),
    "probe": (ProbeConfig, PROBE_BAD),
}


def _leaves(cfg, prefix=""):
    """(dotted key, type) of every settable key of ``cfg``."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, typing.get_type_hints(type(cfg))[f.name]


def _choice_keys(cfg):
    """Literal and bool keys, each with a word that is none of their values."""
    out = {}
    for key, tp in _leaves(cfg):
        inner = _is_optional(tp)[1]
        if typing.get_origin(inner) is typing.Literal or inner is bool:
            out[key] = "nope"
    return out


def _named(key: str, message: str) -> bool:
    """The message names the key as the user wrote it (a nested section's key by its last two parts, as its
    own command line writes it: ``synthetic.size`` of ``data.synthetic.size`` and of ``probe --synthetic size``)."""
    return key in message or ".".join(key.split(".")[-2:]) in message


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_key_has_an_out_of_range_value_or_says_where_it_is_checked(name):
    make, bad = CONFIGS[name]
    keys = {k for k, _ in _leaves(make())}
    covered = set(bad) | set(_choice_keys(make())) | set(FREE)
    assert keys - covered == set(), f"{name}: add these keys to the tables of {__file__}"
    assert set(bad) - keys == set(), f"{name}: these keys no longer exist"


def _cases():
    for name, (make, bad) in CONFIGS.items():
        for key, value in {**bad, **_choice_keys(make())}.items():
            yield pytest.param(name, key, value, id=f"{name}:{key}={value}")


@pytest.mark.parametrize(("name", "key", "value"), list(_cases()))
def test_an_out_of_range_value_is_refused_in_one_line_naming_the_key(name, key, value):
    make, _ = CONFIGS[name]
    with pytest.raises(ConfigError) as info:
        cfg = apply_overrides(make(), [f"{key}={value}"])
        if name == "finetune":
            cfg.batch_layout(1)  # what the run checks first of the batch split
    message = str(info.value)
    assert "\n" not in message and _named(key if name != "probe" else f"probe.{key}", message), message


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["pretrain", "--preset", "demo-cpu", "train.threads=-1", "--print-config"], "train.threads"),
        (["pretrain", "--preset", "demo-cpu", "train.batch_size=0", "--print-config"], "train.batch_size"),
        (["pretrain", "--preset", "demo-cpu", "train.steps=-5", "--print-config"], "train.steps"),
        (["pretrain", "--preset", "demo-cpu", "model.dim=100000000", "--print-config"], "model.dim"),
        (["extract", "RUN", "VIDEOS", "--out", "OUT", "--threads", "-1"], "--threads"),
        (["probe", "RUN", "--threads", "0"], "--threads"),
        (["extract", "RUN", "VIDEOS", "--out", "OUT", "--device", "gpu"], "--device"),
    ],
)
def test_the_command_line_says_it_in_one_line_with_status_2(argv, key, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"levjepa {argv[0]}: ") and key in err[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["extract", "RUN", "VIDEOS", "--out", "OUT", "--workers", "-1"],
        ["extract", "RUN", "VIDEOS", "--out", "OUT", "--window", "0"],
        ["extract", "RUN", "VIDEOS", "--out", "OUT", "--fps", "0"],
        ["extract", "RUN", "VIDEOS", "--out", "OUT", "--shard-rows", "zero"],
        ["classify", "MODEL", "VIDEOS", "--top-k", "0"],
        ["classify", "MODEL", "VIDEOS", "--batch-size", "-3"],
        ["select", "RUN", "--window", "0"],
        ["select", "RUN", "--task", "index:a,b", "--size", "2"],
    ],
)
def test_a_number_option_out_of_range_is_named_as_the_option_where_it_is_parsed(argv, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    option = next(a for a in argv if a.startswith("--") and a not in ("--out", "--task"))
    assert len(err) == 1 and f"argument {option}" in err[0] and "expected a" in err[0], err
