"""Command line: ``sciformer train|pretrain|evaluate|predict|info|report|compare|config``.

Every user-facing error prints one line on stderr and exits with code 2 (130 when
interrupted), without a traceback. ``SCIFORMER_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import sciformer
from sciformer.engine.signals import command_is_process
from sciformer.errors import SciformerError, resource_failure
from sciformer.frontend import one_line_warnings
from sciformer.utils.ranks import check_one_process, is_main_process
from sciformer.utils.text import outlive_closed_stdout, print_names_as_bytes


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. train.epochs=5 model.dim=32")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), exit code 2 as before."""

    def error(self, message: str) -> NoReturn:
        _emit(f"{self.prog}: error: {message} (see {self.prog} --help)")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sciformer", description="Transformers for 3D point clouds and hyperspectral image cubes.")
    parser.add_argument("--version", action="version", version=f"sciformer {sciformer.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="train an experiment from a YAML config")
    train.add_argument("--config", "-c", type=Path, help="experiment YAML")
    train.add_argument("--output-dir", "-o", type=Path, help="run folder (exactly this folder; default runs/<name>-<time>)")
    train.add_argument("--resume", type=Path, metavar="RUN_OR_CKPT", help="continue a stopped run (its folder or its checkpoints/last.pt)")
    train.add_argument("--init-from", type=Path, metavar="RUN_OR_CKPT",
                       help="fine-tune: start a new run from the weights of a checkpoint (a run folder: its best.pt) that match by name and shape")
    train.add_argument("--seed", type=int, help="shortcut for train.seed=N")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    _add_overrides(train)

    pre = sub.add_parser("pretrain", help="hyperspectral: self-supervised masked-band pre-training on a scene's pixels (no labels)")
    pre.add_argument("--config", "-c", required=True, type=Path, help="experiment YAML (its data, model, optimizer and train settings)")
    pre.add_argument("--output-dir", "-o", type=Path, help="run folder (default runs/<name>-pretrain-<time>)")
    pre.add_argument("--seed", type=int, help="shortcut for train.seed=N (the split and normalisation follow it, as in train)")
    pre.add_argument("--epochs", type=int, default=20, help="pre-training epochs (default 20)")
    pre.add_argument("--mask-ratio", type=float, default=0.5, help="fraction of band groups hidden per patch (default 0.5)")
    pre.add_argument("--band-group", type=int, default=10, help="neighbouring bands hidden together (default 10)")
    pre.add_argument("--pixel-ratio", type=float, default=0.0, help="fraction of each patch's pixels hiding their whole spectrum too (default 0)")
    pre.add_argument("--pixels", choices=["all", "train"], default="all",
                     help="all: every pixel of the scene, test and unlabelled included (transductive; default); train: training pixels only")
    _add_overrides(pre)

    evaluate = sub.add_parser("evaluate", help="evaluate a checkpoint on its experiment's test (or val) split")
    evaluate.add_argument("--checkpoint", required=True, type=Path, action="append", metavar="CKPT",
                          help="checkpoint file, or a run folder (its checkpoints/best.pt); repeat it to evaluate an ensemble (probabilities averaged)")
    evaluate.add_argument("--output-dir", "-o", type=Path,
                          help="where to write metrics (default <run>/evaluation for best.pt on test; evaluation-last, evaluation-val, "
                               "evaluation-ensemble-N-<hash> otherwise)")
    evaluate.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation in that folder")
    evaluate.add_argument("--split", choices=["test", "val"], help="split to evaluate (default: evaluation.split)")
    evaluate.add_argument("--votes", type=int, metavar="V", help="test-time votes per sample, classification only (default: evaluation.votes)")
    evaluate.add_argument("--allow-band-mismatch", action="store_true", help="hyperspectral: evaluate a band-index model on other band centres (a loud warning)")
    _add_overrides(evaluate)

    predict = sub.add_parser("predict", help="predict new input files with a trained checkpoint")
    predict.add_argument("--checkpoint", required=True, type=Path, action="append", metavar="CKPT",
                         help="checkpoint file, or a run folder (its checkpoints/best.pt); repeat it to predict with an ensemble")
    predict.add_argument("--input", "-i", required=True, action="append", metavar="PATH",
                         help="input file, folder or quoted glob (repeatable); the model loads once for all")
    predict.add_argument("--output", "-o", required=True,
                         help="output file (its suffix picks the format), or a folder (several inputs, or a path ending in /)")
    predict.add_argument("--format", metavar="SUFFIX", help="output format for a folder output, e.g. ply, laz, npz, tif")
    predict.add_argument("--overwrite", action="store_true", help="replace existing output files (never an input)")
    predict.add_argument("--batch-size", type=int, help="inference batch size (default: evaluation.batch_size)")
    predict.add_argument("--device", help="cpu, cuda, cuda:N (default: the run's train.device)")
    predict.add_argument("--overlap", type=float, default=0.25, help="point scenes: context points per core point of a chunk (default 0.25)")
    predict.add_argument("--tta-rotations", type=int, default=1, metavar="N", help="point scenes: average N turns about z (default 1)")
    predict.add_argument("--tta-flip", action="store_true", help="point scenes: also average mirrored views")
    predict.add_argument("--votes", type=int, default=1, metavar="V", help="shape classification: average V augmented copies (default 1)")
    predict.add_argument("--probabilities", action="store_true", help="also write per-class probabilities: point clouds in the output (.ply, .npz, .las/.laz); "
                         "hyperspectral maps in a second file beside it (NAME_probabilities.npy / .hdr / .tif)")
    predict.add_argument("--columns", metavar="NAMES", help="headerless point files and raw .bin scans: e.g. x,y,z,intensity (float32) or x,y,z,r,g,b:float64")
    predict.add_argument("--category", help="part segmentation: the shape's category (e.g. Airplane)")
    predict.add_argument("--labels", metavar="MAP", help="hyperspectral: a ground-truth label map for the figure and metrics")
    predict.add_argument("--wavelengths", metavar="NM", help="hyperspectral: the input's band centres in nm: 'a,b,...' or a .hdr/.npy/text file")
    predict.add_argument("--allow-band-mismatch", action="store_true", help="hyperspectral: run a band-index model on other band centres (a loud warning)")
    predict.add_argument("--match-frame", action="store_true",
                         help="part segmentation: centre the shape and scale it to the training shapes' radius (other units or frame)")
    _add_overrides(predict)

    sub.add_parser("info", help="versions, devices, optional backends, registered models and datasets")

    report = sub.add_parser("report", help="draw a run's curves.png and confusion_matrix.png from its CSV files")
    report.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folder(s)")
    compare = sub.add_parser("compare", help="one table of runs' status, config differences and metrics")
    compare.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders")
    compare.add_argument("--csv", nargs="?", const="-", metavar="PATH", help="write CSV (to PATH, or stdout) instead of the table")
    compare.add_argument("--overwrite", action="store_true", help="replace an existing --csv file (never one inside a compared run)")
    cfg = sub.add_parser("config", help="list the config keys of a model, dataset or section")
    cfg.add_argument("--list", required=True, metavar="NAME", dest="name", help="a model, a dataset or a section (train, optimizer, ...)")
    return parser


# ------------------------------------------------------------------------- commands


def cmd_train(args: argparse.Namespace) -> int:
    from sciformer.engine.launch import prepare_training, run_training
    from sciformer.engine.signals import terminate_as_interrupt

    terminate_as_interrupt()  # SIGTERM before the first step or after the last: one line, exit 130
    exp, run_dir, state = prepare_training(args.config, args.overrides, output_dir=args.output_dir,
                                           resume=args.resume, seed=args.seed, init_from=args.init_from)
    if args.print_config:
        print(exp.to_yaml(), end="")
        return 0
    run_training(exp, run_dir, state)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from sciformer.engine.pretrain import PretrainSettings, pretrain_config
    from sciformer.engine.signals import terminate_as_interrupt

    terminate_as_interrupt()
    settings = PretrainSettings(epochs=args.epochs, mask_ratio=args.mask_ratio, band_group=args.band_group,
                                pixel_ratio=args.pixel_ratio, pixels=args.pixels)
    pretrain_config(args.config, args.overrides, settings, output_dir=args.output_dir, seed=args.seed)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import torch

    overrides = list(args.overrides) + ([f"evaluation.split={args.split}"] if args.split else [])
    overrides += [f"evaluation.votes={args.votes}"] if args.votes is not None else []
    with torch.no_grad():
        return _evaluate(args, overrides)


def _evaluate(args: argparse.Namespace, overrides: list[str]) -> int:
    from sciformer.engine.evaluation import evaluate_checkpoints

    out_dir = evaluate_checkpoints(args.checkpoint, overrides, args.output_dir,
                                   allow_band_mismatch=args.allow_band_mismatch, overwrite=args.overwrite)
    print(f"wrote {out_dir / 'metrics.json'}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    import torch

    from sciformer.config import check_batch_size
    from sciformer.contracts import PredictOptions
    from sciformer.engine.inference import expand_inputs, plan_outputs, prediction_suffixes

    if args.batch_size is not None:  # as evaluation.batch_size
        check_batch_size(args.batch_size, "--batch-size")
    options = PredictOptions(overlap=args.overlap, rotations=args.tta_rotations, flip=args.tta_flip, votes=args.votes,
                             probabilities=args.probabilities, columns=args.columns, category=args.category, labels=args.labels,
                             wavelengths=args.wavelengths, allow_band_mismatch=args.allow_band_mismatch,
                             match_frame=args.match_frame)
    inputs = expand_inputs(args.input)
    many = len(args.input) > 1 or any(Path(spec).expanduser().is_dir() or not Path(spec).expanduser().exists() for spec in args.input)
    # Every output path is checked against every format any dataset writes before anything loads ...
    many = many or args.output.endswith(("/", os.sep))  # 'preds/': a folder, even for one input
    args.output = Path(args.output)
    plan_outputs(inputs, args.output, prediction_suffixes(None), fmt=args.format, overwrite=args.overwrite, many=many,
                 read_too=read_files(args))
    with torch.no_grad():
        return _predict(args, inputs, many, options)


def read_files(args: argparse.Namespace) -> list[Path]:
    """Files ``predict`` reads besides its inputs (``--labels``, a ``--wavelengths`` file, the checkpoints): never outputs."""
    from sciformer.engine.checkpoint import checkpoint_file

    files = [Path(v).expanduser() for v in (args.labels, args.wavelengths) if v and Path(v).expanduser().is_file()]
    for ckpt in args.checkpoint:
        with contextlib.suppress(SciformerError):  # a folder without a checkpoint fails later, in one line
            files.append(checkpoint_file(Path(ckpt).expanduser(), in_run="best.pt"))
    return [f for f in files if f.is_file()]


def _predict(args: argparse.Namespace, inputs: list[Path], many: bool, options: Any) -> int:
    from sciformer.engine.checkpoint import load_checkpoint
    from sciformer.engine.ensemble import load_models
    from sciformer.engine.inference import (
        plan_outputs,
        predict_fn,
        prediction_suffixes,
        predictor_state,
    )
    from sciformer.engine.staged_outputs import staged_outputs
    from sciformer.registry import DATASETS

    state = load_checkpoint(args.checkpoint[0], in_run="best.pt")
    name = str(((state.get("config") or {}).get("data") or {}).get("name"))
    entry = DATASETS.get(name, key="data.name")
    if entry.predictor is None:
        raise SciformerError(f"dataset '{name}' has no file predictor")
    # ... and against this dataset's formats before the model is built or any data read.
    written_beside, read_beside, labelled_by = (getattr(entry.predictor, attr, None) for attr in ("written_beside", "read_beside", "labelled_by"))
    data_state = state.get("data_state") or {}
    pairs = plan_outputs(inputs, args.output, prediction_suffixes(entry.predictor), fmt=args.format,
                         overwrite=args.overwrite, many=many, read_too=read_files(args),
                         beside=None if written_beside is None else (lambda out: written_beside(out, options)),
                         paired=None if read_beside is None else (lambda inp: read_beside(inp, data_state)),
                         labelled_by=None if labelled_by is None else (lambda out: labelled_by(out, data_state)))
    exp, state, model, device = load_models(args.checkpoint, list(args.overrides), args.device)
    predict = predict_fn(model, device, exp.cfg.train.amp)
    batch_size = args.batch_size or exp.cfg.evaluation.batch_size
    with staged_outputs() as stage:  # published together when every input is predicted; nothing on a failure
        for input_path, output_path in pairs:
            entry.predictor(exp.data_params, predictor_state(state, exp), predict, input_path, stage.path(output_path), batch_size, options=options)
        for path in stage.publish(overwrite=args.overwrite):
            print(f"wrote {path}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import importlib.metadata as md
    import platform

    import torch

    from sciformer.registry import DATASETS, MODELS

    print(f"sciformer {sciformer.__version__}")
    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            print(f"cuda:{i} {torch.cuda.get_device_name(i)}")
    else:
        print("cuda: not available (CPU only)")
    print("optional backends:")
    for dist, purpose in [
        ("pykdtree", "fast CPU kNN"), ("fpsample", "fast CPU farthest point sampling"), ("torch-cluster", "CUDA kNN backend"),
        ("torch-geometric", "PyG interop"), ("open3d", "fast compressed-PCD reading"), ("laspy", "LAS/LAZ LiDAR"), ("lazrs", "LAZ decompression"),
        ("tensorly", "built-in Indian Pines scene"), ("tensorboard", "TensorBoard logs"), ("rasterio", "GeoTIFF maps and cubes"),
    ]:
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            version = "absent"
        print(f"  {dist:<16} {version:<12} {purpose}")
    from sciformer.attention import _neighborhood_native
    from sciformer.geometry import grid_knn
    from sciformer.pointcloud import _edge_select

    for name, lib, purpose in [
        ("grid kNN kernel", grid_knn.kernel(), "fast CPU 3-D kNN"),
        ("v1 attn kernel", _neighborhood_native.library(), "fused CPU Point Transformer v1 attention"),
        ("edge kernel", _edge_select.library(), "CPU transition-down pooling"),
    ]:  # optional compiled kernels, built at install where a C++ compiler exists
        print(f"  {name:<16} {'compiled' if lib else 'absent':<12} {purpose} (built at install by a C++ compiler)")
    print("models:")
    for entry in MODELS.entries():
        print(f"  {entry.name:<22} {entry.summary}")
    print("datasets:")
    for entry in DATASETS.entries():
        print(f"  {entry.name:<22} {entry.summary}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sciformer.engine.reporting import write_report

    for run in args.runs:
        for path in write_report(run):
            print(f"wrote {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from sciformer.engine.compare import compare_runs, format_table, to_csv, write_csv

    header, rows = compare_runs(args.runs)
    if args.csv is None:
        print(format_table(header, rows))
    elif args.csv == "-":
        print(to_csv(header, rows), end="")
    else:
        write_csv(Path(args.csv), to_csv(header, rows), args.runs, overwrite=args.overwrite)
        print(f"wrote {args.csv}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from sciformer.engine.compare import list_config

    print(list_config(args.name))
    return 0


COMMANDS = {"train": cmd_train, "pretrain": cmd_pretrain, "evaluate": cmd_evaluate, "predict": cmd_predict, "info": cmd_info,
            "report": cmd_report, "compare": cmd_compare, "config": cmd_config}


def main(argv: list[str] | None = None) -> int:
    code = _run_command(argv)
    distributed = sys.modules.get("sciformer.engine.distributed")  # not imported: no group joined
    if distributed is not None and distributed.joined() and command_is_process():  # a torchrun rank that is the process
        from sciformer.engine.signals import end_process

        end_process(code)  # not through finalization, which gloo's threads can abort (see engine.distributed)
    return code


def _run_command(argv: list[str] | None) -> int:
    try:  # a signal while the parser is built (a second or more on a loaded machine) is one line too
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        _quiet_signals()
        _emit("sciformer: interrupted")
        return _interrupted_exit()
    if args.command is None:
        return parser.print_help() or 2
    print_names_as_bytes()
    if command_is_process():  # the command is the process: SIGTERM ends any command like Ctrl-C; a closed stdout pipe does not
        from sciformer.engine.signals import terminate_as_interrupt
        outlive_closed_stdout()

        terminate_as_interrupt(process=True)
    try:
        check_one_process(args.command)
        with one_line_warnings():
            code = COMMANDS[args.command](args)
        _quiet_signals()  # done and written: a signal from here on cannot make it look failed
        return code
    except KeyboardInterrupt as exc:  # engine.signals.Interrupted: stopped between steps, its checkpoint written
        _quiet_signals()
        stopped = hasattr(exc, "exit_code")  # its line says how to continue
        _report(args.command, f"error: {exc}" if stopped else "interrupted")
        return exc.exit_code if stopped else _interrupted_exit()  # type: ignore[attr-defined]
    except (SciformerError, OSError, MemoryError, RuntimeError, ImportError) as exc:  # + full disk, unwritable folder, out of memory
        what = str(exc) if isinstance(exc, SciformerError) else resource_failure(exc)
        if what is None or os.environ.get("SCIFORMER_DEBUG"):
            raise
        _quiet_signals()
        _report(args.command, f"error: {what}")
        return exc.exit_code if isinstance(exc, SciformerError) else 2


MAX_MESSAGE = 600  # characters: a 10 MB value in a config never prints 10 MB


def _report(command: str, message: str) -> None:
    """``sciformer <command>: <message>`` as one line on stderr."""
    _emit(f"sciformer {command}: {message}")


def _emit(line: str) -> None:
    """One line on stderr, cut to MAX_MESSAGE characters; under torchrun only rank 0 reports."""
    if not is_main_process():
        return
    line = " ".join(line.split())
    if len(line) > MAX_MESSAGE:
        line = line[: MAX_MESSAGE - 16] + " ... (truncated)"
    print(line, file=sys.stderr)


def _interrupted_exit() -> int:
    """Exit code 130 after a KeyboardInterrupt that was handled.

    When the command is the process, it ends here with ``os._exit`` after the exit handlers
    ran: CPython remembers a KeyboardInterrupt that passed through code it ran with
    ``PyRun_*`` (pybind11's ``exec`` during ``import torch`` does), even when it was caught
    later, and then ends the process by SIGINT (status -2) instead of the code returned."""
    if not command_is_process():  # a test or a script calling main()
        return 130
    from sciformer.engine.signals import end_process

    end_process(130)


def _quiet_signals() -> None:
    """The process reports and ends: no further signal, no 'Exception ignored' (a half-built loader) after the line."""
    from sciformer.engine.signals import quiet_signals

    if command_is_process():  # the command is the process (not a test calling main)
        quiet_signals()
        sys.unraisablehook = lambda unraisable: None


if __name__ == "__main__":
    sys.exit(main())
