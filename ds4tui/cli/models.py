"""`ds4tui models list|pull|path|info`: the registered models, fetching them, where they live, what they are."""

from __future__ import annotations

import argparse

from ds4tui.command import command
from ds4tui.format.display import human_bytes


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="list, pull and locate models", description=__doc__)
    p.set_defaults(func=cmd_list)
    sub = p.add_subparsers(title="verbs", metavar="VERB")
    ls = sub.add_parser("list", help="registered models: name, family, installed?, size, path")
    ls.set_defaults(func=cmd_list)
    pull = sub.add_parser("pull", help="download or build a model (no-op when already there)")
    from ds4tui.engine.defaults import DEFAULT_MODEL

    pull.add_argument("name", nargs="?", default=DEFAULT_MODEL,
                      help=f"a name from `ds4tui models list` (default: {DEFAULT_MODEL}, the chat's model)")
    pull.add_argument("--no-convert", action="store_true",
                      help="do not prepare the converted copy a GGUF's first load makes (the chat then makes it)")
    pull.set_defaults(func=cmd_pull)
    info = sub.add_parser("info", help="load a model and print what it is (architecture, weights, attention, chat)")
    info.add_argument("spec", help="a name from `ds4tui models list`, a GGUF file or a checkpoint directory")
    info.set_defaults(func=cmd_info)
    path = sub.add_parser("path", help="print a model's local path")
    path.add_argument("name", help="a name from `ds4tui models list`")
    path.set_defaults(func=cmd_path)


def _size(path) -> int:
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cmd_list(args: argparse.Namespace) -> int:
    from ds4tui.engine.registry import REGISTRY, installed_path, is_installed

    rows = [("NAME", "FAMILY", "INSTALLED", "SIZE", "PATH")]
    for entry in REGISTRY.values():
        path = installed_path(entry)
        there = is_installed(entry)
        if there:
            state = "yes"
        else:
            state = "no (built on first use)" if entry.builder else "no"
        rows.append((entry.name, entry.family, state, human_bytes(_size(path)) if there else "-", str(path or "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError
    from ds4tui.engine.errors import ModelNotFoundError
    from ds4tui.engine.registry import pull

    from ds4tui.screens.text_progress import TextProgress

    import io

    bar = TextProgress("")
    try:
        # pip's own lines are kept out of the bar (its ERROR line, if any, is in the exception).
        path = pull(args.name, log=io.StringIO(), progress=bar)
    except ModelNotFoundError as exc:
        bar.close(failed=True)
        raise CliError(str(exc)) from None
    bar.close()
    if path.suffix == ".gguf" and not getattr(args, "no_convert", False):
        _load(args.name)  # the first load converts (with a progress bar); later ones are instant
    print(path)
    return 0


def _load(spec: str):
    from ds4tui.cli.errors import CliError
    from ds4tui.screens.text_progress import TextProgress
    from ds4tui.engine.errors import ModelNotFoundError, WeightsError
    from ds4tui.engine.loader import load_model

    bar = TextProgress("preparing (once)")
    try:
        model = load_model(spec, progress=bar)
    except (ModelNotFoundError, WeightsError) as exc:
        bar.close(failed=True)
        raise CliError(str(exc)) from None
    bar.close()
    return model


def cmd_info(args: argparse.Namespace) -> int:
    model = _load(args.spec)
    describe = getattr(model, "describe", None)
    from ds4tui.engine.registry import base_model_note

    print(f"{model.info.name}: {describe() if describe else model.info.family}")
    print(f"  context {model.info.n_ctx} tokens, fingerprint {model.info.fingerprint_hex[:16]}")
    note = base_model_note(args.spec)
    if note:
        print(f"  {note}")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    from ds4tui.cli.errors import CliError
    from ds4tui.engine.errors import ModelNotFoundError
    from ds4tui.engine.registry import REGISTRY, installed_path, resolve_registered

    entry = REGISTRY.get(args.name)
    if entry is None:
        raise CliError(f"unknown model {args.name!r}: see `{command('models list')}`")
    if entry.builder is not None:
        path = installed_path(entry)  # print without building: `path` should be instant
    else:
        try:
            path = resolve_registered(args.name)
        except ModelNotFoundError as exc:
            raise CliError(str(exc)) from None
    print(path)
    return 0
