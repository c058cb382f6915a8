"""trajtune: post-train language-model policies with one weighted log-likelihood.

The package, lowest layer first (docs/code.md has a line per module; each package's docstring lists its own):

    trajectory.py, logprobs.py, config.py, seeding.py, metrics.py, checkpoint.py, processes.py   the core
    objectives/        pure losses: tensors in, (loss, metrics) out
    text/              where conversations become tokens (renderer, chat templates, toy tokenizers)
    audits.py          the book's bias audit and over-optimization signatures
    decontamination.py n-gram overlap between training and evaluation rows
    ratings.py         Elo and Bradley-Terry ratings from pairwise verdicts, the length-controlled win rate
    models/            TinyTransformer, any local Hugging Face model, the model cache, merging, steering
    envs/              environments: text in, text out
    engine/            the one seam between loops and hardware
    sources/           everything that produces the trajectories a loop trains on
    evaluation.py      pass@k and friends, multiple choice, score_policy
    overoptimization.py the over-optimization probe (proxy, gold, KL)
    algorithms/        one training loop per algorithm
    tinker/            the Tinker training API over the engine (trajtune tinker-serve, in-process clients)
    runs/              what a run does around its loops: Run, hooks, resume, stages, run directory, reports, view
    experiments/       runnable compositions as stages (the recipes' experiments)
    recipes/           the built-in TOML recipes
    cli/               the command line (`trajtune`, `python -m trajtune` through __main__.py)
"""

__version__ = "0.1.0"
